"""A client-go `exec` credential plugin for the tests: a short-lived ServiceAccount token from the
TokenRequest API, printed as an ExecCredential.

    exec_credential_plugin.py ADMIN_KUBECONFIG NAMESPACE SERVICEACCOUNT REFRESH_AFTER_SECONDS CALLS_LOG

The token itself lives 10 minutes (TokenRequest's minimum); the expirationTimestamp reported is
5 min + REFRESH_AFTER_SECONDS from now, so a client that refreshes 5 minutes before expiry (as
kubernetes_asyncio does) must run the plugin again after REFRESH_AFTER_SECONDS. Each call appends
"<unix time> <reported expiry, unix time>" to CALLS_LOG.
"""
from __future__ import annotations

import json
import ssl
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import yaml


def main() -> None:
    admin, namespace, account, refresh_after, calls_log = sys.argv[1:6]
    config = yaml.safe_load(Path(admin).read_text())
    cluster = config["clusters"][0]["cluster"]
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                       "spec": {"expirationSeconds": 600}}).encode()
    request = urllib.request.Request(
        f"{cluster['server']}/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        data=body, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=10) as resp:  # noqa: S310 - the test cluster
        token = json.load(resp)["status"]["token"]
    now = time.time()
    expiry = now + 300 + float(refresh_after)
    with open(calls_log, "a") as log:
        log.write(f"{now:.3f} {expiry:.3f}\n")
    print(json.dumps({
        "apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
        "status": {"token": token,
                   "expirationTimestamp": datetime.fromtimestamp(expiry, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
    }))


if __name__ == "__main__":
    main()
