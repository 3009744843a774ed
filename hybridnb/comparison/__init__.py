"""``hn.compare()``: precision, layout, rewrite and compile variants of a model, side by side,
each in its own process (variants.py parses them, session.py runs one, worker.py runs it in its
own process, compare_view.py draws the table and chart, compare_cli.py is the command line)."""
