"""The driver's side of a fit: :class:`~.engine.Engine` and its result (:mod:`.engine`), the
pre-flight checks (:mod:`.preflight`), the barrier job's launch (:mod:`.launch`), a Connect
client's relayed progress and reads (:mod:`.relay`) and a fit's results as DataFrames made on the
executors (:mod:`.frames`).  It may import every other part of the engine."""
