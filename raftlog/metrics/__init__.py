"""Plain, lock-free recorders that the parts of a node update on their hot paths
(``recorders.py``); ``raftlog.observe`` reads them at scrape time and exports them."""
