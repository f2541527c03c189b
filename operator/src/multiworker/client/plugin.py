"""`kubectl mwj`: the client on the command line (kubectl runs `kubectl-mwj` from PATH).

Every error is one line on stderr, `error: ...`, and an exit code a script can act on
(EXIT_CODES, and the help's epilog says them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, TextIO

import urllib3
import yaml
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from multiworker.api.status import Phase
from multiworker.client import render
from multiworker.client.client import Client
from multiworker.client.connection import api_error, one_line, unreachable_message
from multiworker.client.errors import (
    ApiError,
    ClientError,
    ClusterUnreachable,
    InvalidJob,
    JobFailed,
    JobNotFound,
    WaitTimeout,
)
from multiworker.client.job import Job, status_of
from multiworker.client.loglines import Selection
from multiworker.client.progress import failure

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_TIMEOUT, EXIT_CLUSTER = range(6)
EXIT_INTERRUPTED = 130
# Most specific first: the first class an error is an instance of gives its code.
EXIT_CODES: dict[type[BaseException], int] = {
    JobFailed: EXIT_FAILED,
    InvalidJob: EXIT_USAGE,
    JobNotFound: EXIT_NOT_FOUND,
    WaitTimeout: EXIT_TIMEOUT,
    ClusterUnreachable: EXIT_CLUSTER,
    ApiError: EXIT_CLUSTER,
    ClientError: EXIT_CLUSTER,
    OSError: EXIT_USAGE,  # a file that cannot be read
    yaml.YAMLError: EXIT_USAGE,
    ValidationError: EXIT_USAGE,
    ValueError: EXIT_USAGE,
}
EPILOG = """exit codes:
  0  success
  1  the job Failed (wait, submit --wait or --follow)
  2  usage or bad input: a bad flag, an unknown or invalid field, a missing claim
  3  the job was not found
  4  timed out waiting
  5  the cluster could not be reached, or the API server refused for another reason

The cluster is KUBECONFIG's (or ~/.kube/config), or --kubeconfig / --context's.
"""
OUTPUTS = ("json", "yaml")


class Usage(Exception):
    """A command line argparse refuses (exit 2, one line)."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise Usage(f"{message} (see {self.prog} --help)")


def exit_code(error: BaseException) -> int:
    return next((code for kind, code in EXIT_CODES.items() if isinstance(error, kind)),
                EXIT_CLUSTER)


def parser() -> Parser:
    top = Parser(prog="kubectl mwj", description="Submit, follow and inspect MultiWorkerJobs.",
                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _cluster_flags(top, None)
    common = Parser(add_help=False)
    _cluster_flags(common, argparse.SUPPRESS)  # also after the command, as kubectl takes them
    commands = top.add_subparsers(dest="subcommand", required=True, metavar="COMMAND",
                                  parser_class=Parser)
    add = commands.add_parser

    def command(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return add(name, parents=[common], **kwargs)

    _submit_parser(command("submit", help="create a job", epilog=EPILOG,
                           formatter_class=top.formatter_class))
    listed = command("list", help="the namespace's jobs")
    listed.add_argument("-l", "--selector", help="only jobs with these labels (a=b,c=d)")
    listed.add_argument("-A", "--all-namespaces", action="store_true",
                        help="every namespace's jobs")
    listed.set_defaults(run=run_list)
    status = command("status", help="a job's status and its history")
    status.set_defaults(run=run_status)
    logs = command("logs", help="every worker's log, labelled by worker and generation")
    logs.add_argument("-f", "--follow", action="store_true", help="keep streaming, across "
                      "restarts, until the job finishes")
    logs.add_argument("--worker", type=int, help="one worker's lines only")
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--generation", type=int, help="one generation's lines (default: the "
                       "current one's)")
    which.add_argument("--all", action="store_true", help="every generation's lines")
    logs.set_defaults(run=run_logs)
    wait = command("wait", help="wait for a phase (exit 1 if the job Fails)")
    wait.add_argument("--for", dest="until", action="append", metavar="PHASE",
                      choices=[p.value for p in Phase], help="a phase to wait for (default "
                      "Succeeded; repeat for several)")
    wait.add_argument("--timeout", type=duration, help="give up after this "
                      "long (600, 600s, 10m); exit 4")
    wait.set_defaults(run=run_wait)
    for name, (_, _, said) in CHANGES.items():
        command(name, help=said).set_defaults(run=run_change)
    for one in (status, logs, wait, *(commands.choices[n] for n in CHANGES)):
        one.add_argument("job", help="the job's name")
    for one in (listed, status, wait):
        one.add_argument("-o", "--output", choices=OUTPUTS, help="machine-readable output")
    return top


def _cluster_flags(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("-n", "--namespace", default=default,
                        help="the namespace (default: the context's)")
    parser.add_argument("--context", default=default, help="the kubeconfig context to use")
    parser.add_argument("--kubeconfig", default=default,
                        help="the kubeconfig file (default: KUBECONFIG)")


def _submit_parser(submit: argparse.ArgumentParser) -> None:
    submit.add_argument("-f", "--filename", help="a job manifest (YAML or JSON; - for stdin); "
                        "the flags below change what they name in it")
    submit.add_argument("--name", help="the job's name")
    submit.add_argument("--image", help="the training container's image")
    run = submit.add_mutually_exclusive_group()
    run.add_argument("--script", help="a local Python file, shipped in a ConfigMap and run "
                     "with python3")
    run.add_argument("--command", nargs=argparse.REMAINDER, help="the command line (comes "
                     "last: everything after it is the command)")
    submit.add_argument("--workers", type=int, help="how many workers")
    submit.add_argument("--gpus-per-worker", type=int, help="nvidia.com/gpu per worker")
    submit.add_argument("--cpu", help="CPU each worker requests (e.g. 500m)")
    submit.add_argument("--memory", help="memory each worker requests and is capped at")
    submit.add_argument("--claim", help="the checkpoint PersistentVolumeClaim")
    submit.add_argument("--restart-mode", choices=["InPlace", "Recreate"])
    submit.add_argument("--max-restarts", type=int)
    submit.add_argument("--elastic-min", type=int, help="train with as few as this many "
                        "workers when not all can be placed")
    submit.add_argument("--queue", help="the Kueue LocalQueue to wait in")
    submit.add_argument("--env", action="append", default=[], metavar="K=V",
                        help="an environment variable (repeat for several)")
    submit.add_argument("--label", action="append", default=[], metavar="K=V",
                        help="a label on the job (repeat for several)")
    finish = submit.add_mutually_exclusive_group()
    finish.add_argument("--wait", action="store_true", help="wait until it Succeeds (exit 1 "
                        "if it Fails)")
    finish.add_argument("--follow", action="store_true", help="show its progress until it "
                        "finishes (exit 1 if it Fails)")
    submit.add_argument("-o", "--output", choices=OUTPUTS, help="print the job (at the end, "
                        "with --wait or --follow)")
    submit.set_defaults(run=run_submit)


def duration(text: str) -> float:
    try:
        return render.parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pairs(values: Sequence[str], flag: str) -> dict[str, str]:
    """K=V flags as a dict; ValueError names a malformed one."""
    found = {}
    for value in values:
        key, equals, rest = value.partition("=")
        if not equals or not key:
            raise ValueError(f"{flag} {value!r}: write KEY=VALUE")
        found[key] = rest
    return found


def now() -> datetime:
    return datetime.now(UTC)


def dump(value: Any, output: str, out: TextIO) -> None:
    if output == "json":
        print(json.dumps(value, indent=2), file=out)
    else:
        print(yaml.safe_dump(value, sort_keys=False), end="", file=out)


def _finished(job: Job, args: argparse.Namespace, out: TextIO) -> int:
    """After --wait or --follow: the job's end, and exit 1 when it Failed."""
    status = job.follow(progress_bar=sys.stderr.isatty(), out=sys.stderr) if args.follow \
        else job.wait()
    if args.output:
        dump(job.manifest, args.output, out)
    if status.phase is Phase.FAILED:
        raise failure(job.name, status)
    if not args.output:
        print(f"job {job.name} {status.phase.value if status.phase else 'Pending'}", file=out)
    return EXIT_OK


def run_submit(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    manifest = sys.stdin.read() if args.filename == "-" else args.filename
    if not manifest and not (args.name and args.image and (args.command or args.script)):
        raise Usage("submit needs -f FILE, or --name, --image and --command or --script "
                    "(see kubectl mwj submit --help)")
    job = client.submit(
        manifest, name=args.name, image=args.image, command=args.command or None,
        script=args.script, workers=args.workers, gpus_per_worker=args.gpus_per_worker,
        cpu=args.cpu, memory=args.memory, env=pairs(args.env, "--env") or None,
        checkpoint_claim=args.claim, restart_mode=args.restart_mode,
        max_restarts=args.max_restarts, elastic_min_workers=args.elastic_min,
        queue=args.queue, labels=pairs(args.label, "--label") or None)
    if args.wait or args.follow:
        if not args.output:
            print(f"job {job.namespace}/{job.name} created", file=out, flush=True)
        return _finished(job, args, out)
    if args.output:
        dump(job.manifest, args.output, out)
    else:
        print(f"job {job.namespace}/{job.name} created", file=out)
    return EXIT_OK


def run_list(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    jobs = client.list(args.selector, all_namespaces=args.all_namespaces)
    if args.output:
        dump({"apiVersion": "v1", "kind": "List", "items": [j.manifest for j in jobs]},
             args.output, out)
        return EXIT_OK
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"namespace {client.namespace}"
        print(f"no jobs in {where}", file=sys.stderr)
        return EXIT_OK
    rows = [(j.name, status_of(j.name, j.manifest), _created(j)) for j in jobs]
    lines = render.jobs_table(rows, now())
    if args.all_namespaces:  # kubectl's NAMESPACE column first
        width = max(len("NAMESPACE"), *(len(j.namespace) for j in jobs)) + 2
        lines = [("NAMESPACE" if i == 0 else jobs[i - 1].namespace).ljust(width) + line
                 for i, line in enumerate(lines)]
    print("\n".join(lines), file=out)
    return EXIT_OK


def _created(job: Job) -> datetime | None:
    created = job.manifest.get("metadata", {}).get("creationTimestamp")
    return datetime.fromisoformat(created) if created else None


def run_status(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    job = client.get(args.job)
    if args.output:
        dump(job.manifest.get("status") or {}, args.output, out)
        return EXIT_OK
    lines = render.status_lines(f"{job.namespace}/{job.name}",
                                status_of(job.name, job.manifest), now())
    print("\n".join(lines), file=out)
    return EXIT_OK


def run_logs(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    generation: Selection = "all" if args.all else "current" if args.generation is None \
        else int(args.generation)
    for line in client.get(args.job).logs(args.worker, generation, args.follow):
        if line.worker is None:
            print(f"note: {line.text}", file=sys.stderr, flush=True)
        else:
            print(line, file=out, flush=args.follow)
    return EXIT_OK


def run_wait(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    job = client.get(args.job)
    status = job.wait(args.until or ["Succeeded"], args.timeout)
    if args.output:
        dump(job.manifest.get("status") or {}, args.output, out)
    else:
        print(f"job {job.name} {status.phase.value if status.phase else 'Pending'}", file=out)
    return EXIT_OK


# The commands that change a job: the client's call, what is said after, the help.
CHANGES: dict[str, tuple[Callable[[Client, str], object], str, str]] = {
    "suspend": (Client.suspend, "suspended", "suspend a job (its pods go, it stays)"),
    "resume": (Client.resume, "resumed", "resume a suspended job"),
    "delete": (Client.delete, "deleted", "delete a job and what it owns"),
}


def run_change(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    change, done, _ = CHANGES[args.subcommand]
    change(client, args.job)
    print(f"job {args.job} {done}", file=out)
    return EXIT_OK


def error_message(error: BaseException) -> str:
    """One line for any error main() catches."""
    if isinstance(error, ValidationError):
        return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                         for e in error.errors())
    if isinstance(error, OSError) and error.filename:
        return f"{error.filename}: {error.strerror or error}"
    return one_line(str(error)) or type(error).__name__


def translate(error: BaseException) -> BaseException:
    """The kubernetes client's own errors, where one escaped the client, as a ClientError."""
    if isinstance(error, ApiException):
        return api_error(error.status, error.body, "request")
    if isinstance(error, urllib3.exceptions.HTTPError):
        return ClusterUnreachable(unreachable_message("the API server", error))
    return error


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run one `kubectl mwj` command; the exit code (EPILOG)."""
    out = out or sys.stdout
    try:
        args = parser().parse_args(argv)
        client = Client(args.namespace, args.context, args.kubeconfig)
        run: Callable[[Client, argparse.Namespace, TextIO], int] = args.run
        return run(client, args, out)
    except Usage as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # `| head` is done
        return EXIT_OK
    except (ClientError, ApiException, urllib3.exceptions.HTTPError, OSError, yaml.YAMLError,
            ValueError) as e:
        error = translate(e)
        print(f"error: {error_message(error)}", file=sys.stderr)
        return exit_code(error)
