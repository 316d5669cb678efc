"""Multi-node tests on fake hosts (network namespaces with sshd and slurmd); see cluster.py."""
