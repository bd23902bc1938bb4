package main

// rdmakit cni: the CNI plugin of internal/kube/cni. A runtime runs CNI
// plugins by their type name without arguments, so the binary also
// answers to the name rdmakit-cni (alias in main.go).

import "github.com/rdmakit/rdmakit/internal/kube/cni"

func init() { register("cni", cni.Summary, cni.Main) }
