"""`python -m control_plane`: serve the control plane (settings from the environment)."""

from control_plane.server import main

main()
