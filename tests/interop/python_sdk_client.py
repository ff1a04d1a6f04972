"""Sends CloudEvents to a Sluice webhook with the official Python SDK (PyPI `cloudevents`).

Usage: python_sdk_client.py URL
Prints one line per request: `<mode> <status>`. Exits non-zero if a request failed.
"""

import sys
import urllib.request

from cloudevents.core.bindings import http
from cloudevents.core.v1.event import CloudEvent

url = sys.argv[1]
events = {
    "binary": http.to_binary_event(
        CloudEvent(
            attributes={
                "type": "com.example.py.binary",
                "source": "urn:python-sdk",
                "id": "py-binary-1",
                "subject": "orders/7",
                "comexample": "a b ü %",
                "datacontenttype": "application/json",
            },
            data={"message": "Hello", "n": 7},
        )
    ),
    "structured": http.to_structured_event(
        CloudEvent(
            attributes={
                "type": "com.example.py.structured",
                "source": "urn:python-sdk",
                "id": "py-structured-1",
                "datacontenttype": "application/json",
            },
            data={"message": "World"},
        )
    ),
}
failed = False
for mode, message in events.items():
    req = urllib.request.Request(url, data=message.body, headers=dict(message.headers), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            print(mode, resp.status, flush=True)
    except urllib.error.HTTPError as e:
        print(mode, e.code, e.read().decode(), flush=True)
        failed = True
sys.exit(1 if failed else 0)
