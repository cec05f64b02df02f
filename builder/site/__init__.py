"""The GPU VM: launch and deploy, readiness, verify, doctor, P2P, qualify and its receipts.
Imports spec/ and core/ only, never build/: a VM has no `build` extra."""
