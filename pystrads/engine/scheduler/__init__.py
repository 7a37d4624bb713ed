"""The step loop and what it keeps, whoever runs it -- the driver, or the coordinator inside the
fit's job: the loop (:mod:`.loop`), its journal (:mod:`.journal`) and checkpoints
(:mod:`.checkpoints`), the step protocol it speaks to the shards (:mod:`.steps`), the seals on
what the fit's processes hand each other (:mod:`.sealing`), the data fingerprint
(:mod:`.fingerprint`) and the progress display (:mod:`.progress`).  It imports the Program API,
never the executor's or the driver's side."""
