"""Where the run executes: the strategy interface (base.py), DDP (ddp.py), DeepSpeed ZeRO-2
(deepspeed.py) and ``launch()`` for DDP from a notebook (launch.py)."""
