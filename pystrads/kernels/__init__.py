"""numba kernels: numpy in, numpy out; no Spark, no Arrow.

Every kernel is compiled with ``nogil=True``: some run on the driver (the
schedule's round planning, the working-set solver), where the shards'
heartbeat thread must keep running however long a solve takes, or the
shards' lease lapses and they exit mid-fit.

numba caches compiled kernels next to their module; where that folder is not
writable (a read-only site-packages on a cluster), the cache goes to
``<tmp>/pystrads-numba-<uid>`` unless ``NUMBA_CACHE_DIR`` is set. This must
happen before numba is first imported, which importing this package does.
"""

import os
import tempfile

if "NUMBA_CACHE_DIR" not in os.environ and not os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK):
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"pystrads-numba-{os.getuid()}")
