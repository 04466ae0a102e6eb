"""The ``minicompile`` command's tools: inspect a model's compilation, benchmark it, manage the cache.

    target.py     TARGET (script path or module:callable) -> model + example inputs
    capture.py    run the model under a front end, keep every graph, break and guard
    artifacts.py  the printers for every stage (shared with MINICOMPILE_DEBUG)
    repro.py      a standalone script that reruns one compiled graph against eager
    inspect.py    ``minicompile inspect``
    workloads.py  the benchmark workloads and their sizes
    bench.py      ``minicompile bench``: one subprocess per workload, the table, JSON, plot
    bench_worker.py  what runs inside each benchmark subprocess
    cold_compile.py  one compiler's cold compile in a fresh process with every cache empty
    bench_train.py, bench_models.py, bench_dynamic.py  ``bench --train``, ``--models``, ``--dynamic``

Nothing in the compile pipeline imports this package except ``pipeline._debug_dump``,
which reuses the printers in artifacts.py (they depend only on the CompiledGraph's fields).
"""
