package main

import (
	"github.com/spf13/pflag"

	"github.com/krfs/krfs/nic"
)

// rdmaFlags are the rdma backend's --device, --port and --gid-index of
// the commands that run a node's NIC (krfs mount and meta).
type rdmaFlags struct {
	device         string
	port, gidIndex int
}

func (r *rdmaFlags) register(set *pflag.FlagSet) {
	set.StringVar(&r.device, "device", "", "rdma: the RDMA device, like mlx5_0 (default: the first usable one)")
	set.IntVar(&r.port, "port", 0, "rdma: the device's port number (0: the first active one)")
	set.IntVar(&r.gidIndex, "gid-index", -1, "rdma: the GID table index (-1: the port's RoCEv2 IPv4 GID, or GID 0 on InfiniBand)")
}

func (r *rdmaFlags) apply(o *nic.Options) {
	o.Device, o.Port, o.GIDIndex = r.device, r.port, r.gidIndex
}

// qosFlags are the rdma backend's quality-of-service flags (rdma.QoS),
// shared by the commands that open a NIC.
type qosFlags struct{ trafficClass, sl, hopLimit int }

func (q *qosFlags) register(set *pflag.FlagSet) {
	set.IntVar(&q.trafficClass, "traffic-class", 0, "rdma: GRH traffic class of every QP (RoCEv2: DSCP<<2, e.g. 104 for DSCP 26, the class a PFC/ECN fabric makes lossless)")
	set.IntVar(&q.sl, "sl", 0, "rdma: service level 0..15 (InfiniBand; some RoCE drivers map it to the VLAN priority)")
	set.IntVar(&q.hopLimit, "hop-limit", 0, "rdma: GRH hop limit (RoCEv2: IP TTL; 0: 64)")
}

func (q *qosFlags) apply(o *nic.Options) {
	o.TrafficClass, o.SL, o.HopLimit = q.trafficClass, q.sl, q.hopLimit
}
