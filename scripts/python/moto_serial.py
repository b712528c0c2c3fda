"""moto's S3 server, one request at a time (scripts/services starts it).

moto 5.2.1 checks a conditional PutObject (If-None-Match, If-Match) and then writes, in two steps:
under its threaded server two writers can both pass the check when the machine is loaded (seen:
2 of 8 racing create-if-absent writes succeeded, at a load of ~7). S3 itself applies each
conditional write atomically, which is what the leasehold-s3 store and its tests rely on. So the
app runs every request whole under one lock: the server keeps its threads (keep-alive
connections), but no two requests interleave.

Usage: python moto_serial.py HOST PORT
"""

import signal
import sys
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serial(environ, start_response):
        with lock:
            # The body is read out under the lock too: the request is done when it is released.
            return list(app(environ, start_response))

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_simple(host, port, serial, threaded=True)


if __name__ == "__main__":
    main()
