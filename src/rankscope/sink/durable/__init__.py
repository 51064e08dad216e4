"""What makes an acknowledged point survive a crash: the write-ahead log (``wal``) and ``replay``.

A run's records are appended and fsynced before the client is answered; on start, what the
views had not written goes back into its run. Nothing here imports the book: replay hands the
records back through the ``replay.Replaying`` protocol the sink's registry fills.
"""
