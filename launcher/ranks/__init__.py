"""What the launcher knows of each rank, folded once from the rank's events (``record``): read
by the supervisor, the hang check, the phases, the monitor and node 0's attempt."""
from launcher.ranks.record import RankRecord

__all__ = ["RankRecord"]
