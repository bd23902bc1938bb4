package main

// rdmakit device-plugin: the command line of internal/kube/deviceplugin,
// the Kubernetes device plugin for RDMA devices.

import "github.com/rdmakit/rdmakit/internal/kube/deviceplugin"

func init() { register("device-plugin", deviceplugin.Summary, deviceplugin.Main) }
