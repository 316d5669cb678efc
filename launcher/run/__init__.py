"""Ranks running on one node, the same on node 0 and in every agent: the one watch loop
(``watch``: the stop signals, ``HeldStopSignals`` between attempts) and its source for this
node's ranks (``supervisor``); their processes (``process``, ``stdin_feed``; ``strays``: the
sweep by the launch's token and the guardian), output (``output``; ``console_lines``: node 0's
console), events (``events``), ranks without the rank hook (``hookless``), warm spares for the
next attempt (``spares``) and node 0's half of last words (``last_words``). How an attempt ended
is told in ``failures``; what follows is pure: the restart policy (``restarts``) and the one
decision the restart loop carries out (``restart_decision``)."""
