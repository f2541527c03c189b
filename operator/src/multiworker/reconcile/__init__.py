"""One pass over one job, as a flat list of named steps (`reconcile.py`): read the view, decide,
create or delete the group, commit status once, then Events. May import every folder below it.
"""
