"""`extrapos encodings`: list the registry (owned by the models work; placeholder)."""


def register(sub) -> None:
    p = sub.add_parser("encodings", help="list the positional encodings")
    p.set_defaults(func=lambda args: print("\n".join(__import__("extrapos.positions.registry", fromlist=["names"]).names())))
