"""Pure rules: what a pod's state means, when to restart or fail, what counts as a hang, where a
group fits. No I/O and no clock of their own (the caller passes `now`); imports only `api`.
"""
