#!/bin/sh
# Launch agent for mpirun (--mca plm_rsh_agent): instead of ssh-ing to HOST,
# runs the command in the network namespace that owns HOST's address.
# Hosts are node addresses 10.77.0.(I+1) from deploy/netns-cluster.sh; the
# command mpirun passes (one shell string that starts orted) runs with
# /bin/sh inside obcomm-nI. Each namespace gets its own UTS namespace and
# hostname obcomm-nI, so Open MPI sees distinct nodes.
#
#   netns-rsh.sh [ssh-style options] HOST COMMAND...
set -eu
while [ $# -gt 0 ]; do
    case "$1" in
    -x | -n | -T) shift ;;
    *) break ;;
    esac
done
host=$1
shift
case "$host" in
10.77.0.*) node=$((${host##*.} - 1)) ;;
obcomm-n*) node=${host#obcomm-n} ;;
*) echo "netns-rsh: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "obcomm-n$node" unshare --uts /bin/sh -c \
    "hostname obcomm-n$node; $*"
