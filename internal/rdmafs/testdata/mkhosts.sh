#!/bin/sh
# Regenerates the fixture hosts under hosts/: the files of /sys and /proc
# that rdmafs, rdmakit doctor and rdmakit exporter read, as the kernel
# writes them, for a healthy mlx5 RoCE host, an rxe host, a siw host, a
# host without RDMA, and one host per fault. Run from this directory.
set -eu
rm -rf hosts
w() { mkdir -p "$(dirname "$1")"; printf '%s\n' "$2" >"$1"; }

base() { # $1 host dir: a two-socket machine with eth0 at MTU $2
	h=hosts/$1
	w $h/proc/meminfo "MemTotal:       263842424 kB
HugePages_Total:    1024
HugePages_Free:     1000
Hugepagesize:       2048 kB"
	w $h/sys/kernel/mm/transparent_hugepage/enabled "always [madvise] never"
	w $h/proc/net/route "Iface	Destination	Gateway 	Flags	RefCnt	Use	Metric	Mask		MTU	Window	IRTT
eth0	00000000	0100000A	0003	0	0	0	00000000	0	0	0"
	w $h/proc/net/ip_tables_names ""
	: >$h/proc/net/ip_tables_names
	for c in 0 1 2 3; do w $h/sys/devices/system/cpu/cpu$c/cpufreq/scaling_governor performance; done
	w $h/sys/devices/system/node/node0/cpulist 0-1
	w $h/sys/devices/system/node/node1/cpulist 2-3
	w $h/sys/class/net/eth0/mtu $2
	w $h/sys/module/ib_core/parameters/netns_mode Y
}

modules() { # $1 host dir, then module names
	h=hosts/$1; shift
	: >$h/proc/modules
	for m in "$@"; do
		echo "$m 139264 1 - Live 0x0000000000000000" >>$h/proc/modules
		w $h/sys/module/$m/refcnt 1
	done
}

gids() { # $1 device dir, $2 port, then index:gid:type triples
	gd=$1/ports/$2; shift 2
	for i in 0 1 2 3 4 5 6 7; do w $gd/gids/$i 0000:0000:0000:0000:0000:0000:0000:0000; done
	for e in "$@"; do
		i=${e%%=*}; rest=${e#*=}; gid=${rest%%@*}; typ=${rest#*@}
		w $gd/gids/$i "$gid"; w $gd/gid_attrs/types/$i "$typ"; w $gd/gid_attrs/ndevs/$i eth0
	done
}

port() { # $1 device dir, $2 port, $3 state, $4 phys, $5 rate
	pd=$1/ports/$2
	w $pd/state "$3"; w $pd/phys_state "$4"; w $pd/rate "$5"; w $pd/link_layer Ethernet
	for c in port_xmit_data port_rcv_data port_xmit_packets port_rcv_packets symbol_error link_downed port_rcv_errors port_xmit_discards; do
		w $pd/counters/$c 0
	done
	w $pd/counters/port_xmit_data 123456789
	w $pd/counters/port_rcv_data 987654321
	w $pd/counters/port_xmit_packets 4242
	w $pd/counters/port_rcv_packets 4343
}

devnodes() { # $1 host, $2 device: uverbs0 and rdma_cm (empty files stand for the nodes)
	w hosts/$1/sys/class/infiniband_verbs/uverbs0/ibdev $2
	w hosts/$1/dev/infiniband/uverbs0 ""; : >hosts/$1/dev/infiniband/uverbs0
	: >hosts/$1/dev/infiniband/rdma_cm
}

healthy_gids() {
	gids $1 1 "0=fe80:0000:0000:0000:0ac0:ebff:fe00:0001@IB/RoCE v1" "1=fe80:0000:0000:0000:0ac0:ebff:fe00:0001@RoCE v2" \
		"2=0000:0000:0000:0000:0000:ffff:0a00:0001@IB/RoCE v1" "3=0000:0000:0000:0000:0000:ffff:0a00:0001@RoCE v2"
}

mlx5() { # $1 host
	h=hosts/$1; d=$h/sys/class/infiniband/mlx5_0
	base $1 9000
	modules $1 ib_core ib_uverbs rdma_ucm rdma_cm ib_cm mlx5_core mlx5_ib
	w $d/node_type "1: CA"; w $d/fw_ver 28.39.1002; w $d/hca_type MT4125
	devnodes $1 mlx5_0
	w $d/device/numa_node 1
	w $d/device/net/eth0/ifindex 2
	ln -s ../../../../../../bus/pci/drivers/mlx5_core $d/device/driver
	port $d 1 "4: ACTIVE" "5: LinkUp" "100 Gb/sec (2X HDR)"
	healthy_gids $d
	for c in rnr_nak_retry_err local_ack_timeout_err out_of_sequence np_cnp_sent rp_cnp_handled np_ecn_marked_roce_packets duplicate_request packet_seq_err implied_nak_seq_err; do
		w $d/ports/1/hw_counters/$c 0
	done
	w $d/ports/1/hw_counters/np_cnp_sent 17
	w $d/ports/1/hw_counters/rp_cnp_handled 5
	w $d/ports/1/hw_counters/out_of_sequence 3
	w $d/ports/1/hw_counters/lifespan 10
	w $d/hw_counters/num_system_events 2
	w $d/hw_counters/lifespan 10
}

mlx5 mlx5-healthy

# rxe over eth0 (MTU 1500): a software device, no PCI function.
base rxe 1500
modules rxe ib_core ib_uverbs rdma_ucm rdma_rxe ip6_udp_tunnel udp_tunnel
d=hosts/rxe/sys/class/infiniband/rxe0
w $d/node_type "1: CA"; w $d/fw_ver 0.0.0; w $d/parent eth0
devnodes rxe rxe0
w hosts/rxe/sys/class/net/eth0/device/numa_node 0
port $d 1 "4: ACTIVE" "5: LinkUp" "100 Gb/sec (4X EDR)"
healthy_gids $d
w $d/ports/1/hw_counters/sent_pkts 1000
w $d/ports/1/hw_counters/rcvd_pkts 999
w $d/ports/1/hw_counters/duplicate_request 2
w $d/ports/1/hw_counters/rcvd_rnr_err 1
w $d/ports/1/hw_counters/lifespan 10

# siw over eth0: iWARP (node type RNIC), its GID is the MAC address.
base siw 1500
modules siw ib_core ib_uverbs rdma_ucm rdma_cm iw_cm siw
d=hosts/siw/sys/class/infiniband/siw0
w $d/node_type "4: RNIC"; w $d/parent eth0
devnodes siw siw0
port $d 1 "4: ACTIVE" "5: LinkUp" "10 Gb/sec (4X SDR)"
w $d/ports/1/gids/0 0ac0:ebff:fe00:0000:0000:0000:0000:0000
w hosts/siw/sys/class/net/eth0/device/numa_node 0

# A host without RDMA: no modules, no class directory.
base none 1500
modules none ext4 overlay

# Faults, each one change from mlx5-healthy.
mlx5 module-missing
modules module-missing ib_core rdma_cm ib_cm mlx5_core mlx5_ib

mlx5 port-down
w hosts/port-down/sys/class/infiniband/mlx5_0/ports/1/state "1: DOWN"
w hosts/port-down/sys/class/infiniband/mlx5_0/ports/1/phys_state "3: Disabled"

mlx5 no-rocev2
d=hosts/no-rocev2/sys/class/infiniband/mlx5_0
rm -rf $d/ports/1/gids $d/ports/1/gid_attrs
gids $d 1 "0=fe80:0000:0000:0000:0ac0:ebff:fe00:0001@IB/RoCE v1" "1=0000:0000:0000:0000:0000:ffff:0a00:0001@IB/RoCE v1"

mlx5 mtu-mismatch
w hosts/mtu-mismatch/sys/class/net/eth0/mtu 4100
rm -rf hosts/module-missing/sys/module/ib_uverbs hosts/module-missing/sys/module/rdma_ucm
rm -rf hosts/none/sys/module/ib_core

# A container without /dev/infiniband (sysfs shows the devices).
mlx5 no-devnodes
rm -rf hosts/no-devnodes/dev

# rxe over a netdev without an IPv4 address: only the link-local GIDs.
base link-local 1500
modules link-local ib_core ib_uverbs rdma_ucm rdma_rxe
d=hosts/link-local/sys/class/infiniband/rxe0
w $d/node_type "1: CA"; w $d/parent eth0
devnodes link-local rxe0
port $d 1 "4: ACTIVE" "5: LinkUp" "100 Gb/sec (4X EDR)"
gids $d 1 "0=fe80:0000:0000:0000:0ac0:ebff:fe00:0001@IB/RoCE v1" "1=fe80:0000:0000:0000:0ac0:ebff:fe00:0001@RoCE v2"
rm -rf hosts/module-missing/sys/class/infiniband_verbs hosts/module-missing/dev/infiniband/uverbs0

# A ConnectX NIC (eth0 on mlx5_core) without mlx5_ib: no RDMA device.
base driver-missing 9000
modules driver-missing ib_core ib_uverbs rdma_ucm mlx5_core
mkdir -p hosts/driver-missing/sys/class/net/eth0/device
ln -s ../../../../bus/pci/drivers/mlx5_core hosts/driver-missing/sys/class/net/eth0/device/driver

# A cluster node for the device plugin: every kind of device at once.
# mlx5_0 a RoCE PF (eth0) with two VFs (mlx5_2, mlx5_3 on eth0v0, eth0v1),
# mlx5_1 InfiniBand (ib0), rxe0 over eth1, siw0 over eth2, and efa_0 (an
# EFA-like device: its own link layer, no netdev).
base cluster 9000
modules cluster ib_core ib_uverbs rdma_ucm ib_umad mlx5_core mlx5_ib rdma_rxe siw efa
h=hosts/cluster
mkdir -p $h/dev/infiniband; : >$h/dev/infiniband/rdma_cm
n=0
cdev() { # $1 device, $2 uverbs number, then mad numbers
	w $h/sys/class/infiniband_verbs/uverbs$2/ibdev $1; : >$h/dev/infiniband/uverbs$2
	d=$1; shift 2
	for m in "$@"; do
		for k in umad issm; do w $h/sys/class/infiniband_mad/$k$m/ibdev $d; w $h/sys/class/infiniband_mad/$k$m/port 1; : >$h/dev/infiniband/$k$m; done
	done
}
pci() { # $1 device, $2 addr, $3 vendor:device, $4 driver, $5 numa, $6 physfn or ""
	pd=$h/sys/class/infiniband/$1/device
	w $pd/uevent "DRIVER=$4
PCI_CLASS=20000
PCI_ID=$3
PCI_SUBSYS_ID=15B3:0062
PCI_SLOT_NAME=$2"
	w $pd/vendor 0x${3%%:*}; w $pd/device 0x${3#*:}; w $pd/numa_node $5
	ln -s ../../../../bus/pci/drivers/$4 $pd/driver
	[ -z "$6" ] || ln -s ../$6 $pd/physfn
	w $h/sys/bus/pci/devices/$2/infiniband/$1/ibdev $1
}
cport() { # $1 device, $2 link layer, $3 netdev or "", $4 rate
	pd=$h/sys/class/infiniband/$1/ports/1
	w $pd/state "4: ACTIVE"; w $pd/phys_state "5: LinkUp"; w $pd/rate "$4"; w $pd/link_layer "$2"
	w $pd/counters/port_xmit_data 0
	[ -n "$3" ] || return 0
	w $h/sys/class/net/$3/mtu 9000
	if [ "$2" = Ethernet ]; then
		w $pd/gids/0 fe80:0000:0000:0000:0ac0:ebff:fe00:0001; w $pd/gid_attrs/types/0 "IB/RoCE v1"; w $pd/gid_attrs/ndevs/0 $3
		w $pd/gids/1 fe80:0000:0000:0000:0ac0:ebff:fe00:0001; w $pd/gid_attrs/types/1 "RoCE v2"; w $pd/gid_attrs/ndevs/1 $3
	fi
}
for d in mlx5_0 mlx5_1 mlx5_2 mlx5_3 efa_0; do w $h/sys/class/infiniband/$d/node_type "1: CA"; done
pci mlx5_0 0000:03:00.0 15B3:101D mlx5_core 0 ""; cport mlx5_0 Ethernet eth0 "200 Gb/sec (4X HDR)"; cdev mlx5_0 0 0
pci mlx5_1 0000:04:00.0 15B3:101B mlx5_core 1 ""; cport mlx5_1 InfiniBand "" "200 Gb/sec (4X HDR)"; cdev mlx5_1 1 1
mkdir -p $h/sys/class/infiniband/mlx5_1/device/net/ib0; w $h/sys/class/net/ib0/mtu 4092
w $h/sys/class/infiniband/mlx5_1/ports/1/gids/0 fe80:0000:0000:0000:0ac0:ebff:fe00:0002
pci mlx5_2 0000:03:00.2 15B3:101E mlx5_core 0 0000:03:00.0; cport mlx5_2 Ethernet eth0v0 "200 Gb/sec (4X HDR)"; cdev mlx5_2 2 2
pci mlx5_3 0000:03:00.3 15B3:101E mlx5_core 0 0000:03:00.0; cport mlx5_3 Ethernet eth0v1 "200 Gb/sec (4X HDR)"; cdev mlx5_3 3 3
w $h/sys/class/infiniband/rxe0/node_type "1: CA"; w $h/sys/class/infiniband/rxe0/parent eth1
cport rxe0 Ethernet eth1 "100 Gb/sec (4X EDR)"; cdev rxe0 4
w $h/sys/class/infiniband/siw0/node_type "4: RNIC"; w $h/sys/class/infiniband/siw0/parent eth2
cport siw0 Ethernet "" "10 Gb/sec (4X SDR)"; w $h/sys/class/net/eth2/mtu 1500; cdev siw0 5
pci efa_0 0000:00:06.0 1D0F:EFA1 efa 0 ""; cport efa_0 Unspecified "" "100 Gb/sec (4X EDR)"; cdev efa_0 6
