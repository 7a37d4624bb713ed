"""What runs in the executors' tasks: the workers (:mod:`.worker`), the coordinator that runs the
step loop inside the fit's job under Spark Connect (:mod:`.coordinator`), and the reads of a
finished fit's tables and exports (:mod:`.reads`).  It imports the scheduler and the Program
API, never the driver's side or the estimators."""
