"""The ``hvd-bert`` command (placeholder until subcommands are added below)."""
def main(argv=None):
    return 0
