#!/usr/bin/env bash
# wait-crd.sh CRD [SECONDS]: wait quietly until the API server serves CRD (Established), for
# scripts that apply crds/ and then use it. Polled, because `kubectl wait` fails outright while
# a just-created CRD has no conditions yet; kubectl's errors are kept out of the output (a
# jsonpath miss prints the whole 650 KB CRD). On timeout: one line with the CRD's conditions.
set -uo pipefail
crd=${1:?usage: wait-crd.sh CRD [SECONDS]}
limit=${2:-60}
query='{.status.conditions[?(@.type=="Established")].status}'
deadline=$((SECONDS + limit))
while [ $SECONDS -lt "$deadline" ]; do
  [ "$(kubectl get crd "$crd" -o "jsonpath=$query" 2>/dev/null)" = True ] && exit 0
  sleep 0.5
done
conditions=$(kubectl get crd "$crd" -o 'jsonpath={range .status.conditions[*]}{.type}={.status} ({.reason}) {end}' 2>&1 | head -c 300)
echo "wait-crd.sh: $crd is not Established after ${limit}s: ${conditions:-no conditions}" >&2
exit 1
