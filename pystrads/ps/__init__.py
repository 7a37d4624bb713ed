"""The parameter-server shards: the Arrow Flight server process (:mod:`.server`) and its client
(:mod:`.client`), a shard's table slices with their undo logs (:mod:`.table`), its steps, write
fences and round clocks (:mod:`.steps`), request checks (:mod:`.request`), the workers'
mailbox (:mod:`.mailbox`), checkpoints of a shard's rows (:mod:`.snapshots`, on the filesystems
of :mod:`.storage`), range partitioning of tables over shards (:mod:`.partition`), the wire
format (:mod:`.protocol`), memory and per-run TLS helpers, and the launcher that starts, watches
and stops the shard processes of an application (:mod:`.launcher`)."""
