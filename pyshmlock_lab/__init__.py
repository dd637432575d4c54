"""The showroom around the lock: the demo server, the benchmark harness and
the cluster test scaffolding.  Shipped in the same distribution as
``pyshmlock`` but not part of it: the product never imports this package,
except lazily from the command's ``demo``, ``bench`` and ``cluster-demo``
subcommands (``tests/test_product_package_holds_only_the_lock.py``).

    demo/     ``pyshmlock demo``: an SGLang-shaped multi-worker server
    bench/    ``pyshmlock bench``: the multi-process benchmark harness
    cluster/  a real local etcd, simulated hosts, the HTTP fan-out, and
              ``pyshmlock cluster-demo`` (the cross-host races)
"""
