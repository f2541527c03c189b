# shellcheck shell=bash
# No packet to an address this project hands out leaves the machine. Every range a project
# cluster gives to pods, services and nodes (real or kwok's fake ones) is served here (a bridge,
# a route to a node) or locally *unreachable* while that cluster is up, so a connection to an
# address with nothing behind it fails at once ("No route to host") instead of going out
# through the default route to somebody else's network. Sourced by hack/cluster/lib.sh and
# hack/kind/lib.sh; the test is tests/integration/test_address_ranges.py.
#
#   guard_ranges OWNER METRIC CIDR=WHAT...  an `unreachable` route per range, tagged with
#                                           METRIC; the list goes to $state/ranges-OWNER
#   unguard_ranges OWNER METRIC             removes every unreachable route tagged METRIC
#
# A guard never shadows a route that serves its range: a serving route of the same prefix has
# a lower metric (0) and wins, and a longer prefix (a bridge's subnet, a node's pod subnet)
# wins anyway. Both are idempotent. Private ranges are never blocked wholesale: only the
# prefixes listed by the scripts that hand them out.

guard_ranges() {
  local owner=$1 metric=$2 pair cidr; shift 2
  [ "$(id -u)" = 0 ] || { echo "[ranges] not root: no unreachable routes for $owner" >&2; return 0; }
  command -v ip >/dev/null || { echo "[ranges] no ip command: no unreachable routes for $owner" >&2; return 0; }
  mkdir -p "$state"
  : > "$state/ranges-$owner.new"
  for pair in "$@"; do
    cidr=${pair%%=*}
    ip route replace unreachable "$cidr" metric "$metric"
    printf '%s %s\n' "$cidr" "${pair#*=}" >> "$state/ranges-$owner.new"
  done
  mv "$state/ranges-$owner.new" "$state/ranges-$owner"
}

unguard_ranges() { # every unreachable route with METRIC goes, whether or not the list survived
  local owner=$1 metric=$2 cidr
  if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
    for cidr in $( { ip -4 route show type unreachable; ip -6 route show type unreachable; } \
        | awk -v m="$metric" '{for (i = 1; i < NF; i++) if ($i == "metric" && $(i + 1) == m) print $2}'); do
      ip route del unreachable "$cidr" metric "$metric" 2>/dev/null || true
    done
  fi
  rm -f "$state/ranges-$owner"
}
