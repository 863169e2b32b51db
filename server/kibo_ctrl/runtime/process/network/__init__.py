"""Guest networking of the process runtime: per guest a network namespace, its veth and
nftables chain, and the resolver that enforces domain rules."""
