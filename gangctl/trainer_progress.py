"""Report training progress from inside a trainer pod: `status.trainerStatus` of its TrainJob.

Standard library only, so it runs in any image with Python (or copy this file into one). It uses what
gangctl — as Kubeflow Trainer v2.2+ — gives every trainer container: KUBEFLOW_TRAINER_STATUS_URL,
KUBEFLOW_TRAINER_STATUS_CA_CERT and KUBEFLOW_TRAINER_STATUS_TOKEN.

    from gangctl.trainer_progress import report
    report(progress=40, remaining_seconds=600, metrics={"loss": 0.231, "epoch": 2})

    python -m gangctl.trainer_progress --progress 40 --metric loss=0.231

`report` never raises: training must not stop because a report did not go through. It returns the
HTTP status (200: recorded; 429: too often, retry later; 0: not sent, e.g. outside a TrainJob).
"""
from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from datetime import datetime, timezone

URL, CA_CERT, TOKEN = "KUBEFLOW_TRAINER_STATUS_URL", "KUBEFLOW_TRAINER_STATUS_CA_CERT", "KUBEFLOW_TRAINER_STATUS_TOKEN"


def payload(progress: int | None = None, remaining_seconds: int | None = None,
            metrics: dict[str, object] | None = None) -> dict:
    status: dict = {"lastUpdatedTime": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if progress is not None:
        status["progressPercentage"] = int(progress)
    if remaining_seconds is not None:
        status["estimatedRemainingSeconds"] = int(remaining_seconds)
    if metrics:
        status["metrics"] = [{"name": str(k), "value": str(v)} for k, v in metrics.items()]
    return {"trainerStatus": status}


def report(progress: int | None = None, remaining_seconds: int | None = None,
           metrics: dict[str, object] | None = None, *, timeout: float = 5.0) -> int:
    """POST one report; the HTTP status, or 0 when it could not be sent (a message on stderr)."""
    url, ca_file, token_file = (os.environ.get(k) for k in (URL, CA_CERT, TOKEN))
    if not (url and ca_file and token_file):
        return 0
    try:
        with open(token_file) as f:
            token = f.read().strip()  # re-read each time: the token file is rotated
        context = ssl.create_default_context(cafile=ca_file)
        request = urllib.request.Request(url, data=json.dumps(payload(progress, remaining_seconds, metrics)).encode(),
                                         method="POST", headers={"Authorization": f"Bearer {token}",
                                                                 "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:  # noqa: S310
            return answer.status
    except urllib.error.HTTPError as err:
        print(f"[trainer-progress] report refused ({err.code}): {err.read().decode(errors='replace')}",
              file=sys.stderr)
        return err.code
    except (OSError, ValueError) as err:
        print(f"[trainer-progress] report not sent: {err}", file=sys.stderr)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gangctl.trainer_progress", description=__doc__.split("\n")[0])
    parser.add_argument("--progress", type=int, help="percent done, 0-100")
    parser.add_argument("--remaining-seconds", type=int, help="estimated seconds left")
    parser.add_argument("--metric", action="append", default=[], metavar="NAME=VALUE")
    opts = parser.parse_args(argv)
    metrics = dict(m.split("=", 1) for m in opts.metric)
    code = report(opts.progress, opts.remaining_seconds, metrics)
    return 0 if code == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
