"""SSH trust: keys, the worker's private sshd, the launcher's ssh config, and the two
exchanges by which they learn about each other (dir, net)."""
