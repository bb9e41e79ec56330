"""``hvd-bert`` as one rank of a job whose ranks were given different arguments, as ranks that
read different recipe files or environments would be (tests/parallel/test_adversarial.py):

    python per_rank_args.py '{"1": ["--set", "train.optim.lr=0.5"]}' pretrain --set ...

Rank r runs ``hvd-bert ARGS... + the arguments listed for r``.
"""

import json
import os
import sys

from hvd_bert.cli import main

rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
extra = json.loads(sys.argv[1]).get(rank, [])
sys.exit(main([*sys.argv[2:], *extra]))
