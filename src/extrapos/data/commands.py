"""`extrapos data ...` (placeholder until the data layer lands)."""


def register(sub) -> None:
    sub.add_parser("data", help="prepare and inspect tokenized corpora")
