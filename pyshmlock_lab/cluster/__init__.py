"""Test and demo scaffolding for ``pyshmlock.cluster``: a real etcd cluster
on loopback (``localetcd.LocalEtcd``), a simulated host's worker process
(``simhost``), a host's HTTP pause/continue server as RL frameworks fan out
to it today (``fanout``), and ``pyshmlock cluster-demo``, the cross-host
races driven both ways on simulated hosts (``crosshost_demo``)."""
