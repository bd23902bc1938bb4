package coll

// roce devices (software RoCEv2 on UDP) for Options.Transport "roce". Not
// chosen by auto where tcp is there (see netPreference). Ranks of one
// host in separate processes need their own address or port:
// RDMAKIT_ROCE_ADDR=:0 (the device's address, a port of the system's
// choosing) or one address each.
import _ "github.com/rdmakit/rdmakit/transport/roce"
