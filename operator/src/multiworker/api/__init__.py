"""What a user writes and reads: the spec, status, conditions, names, the CRD, the operator-worker
contract. The bottom layer: imports no other multiworker folder. This file stays empty of
imports, since the worker runtime imports `api.contract` (stdlib-only) without pydantic.
"""
