"""What the operator ships into every in-place worker pod and runs there: the restart agent
(agent.py: a sidecar and a gate; notes.py: the operator's word over HTTP; state.py: the pod's
generation as they know it, in files), the warm launcher of the trainer (launcher.py,
children.py) and the hook its spare interpreters start with (warm_hook.py).

Every file here is shipped as it is in the job's ConfigMap (reconcile/render.py reads this
folder, so a new file cannot be forgotten) and runs with the python3 of the user's training
image, whatever else that image holds: the standard library only, and a sibling file by its
bare name (the folder is first on sys.path; imported from the package, as the tests do, by
its package name). An import-linter contract keeps it so. The trainers' library is
`multiworker.runtime`; nothing here imports it, nor it this.
"""
