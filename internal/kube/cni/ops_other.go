//go:build !linux

package cni

type linuxOps struct{}

func (linuxOps) NetnsMode() (string, error)               { return "", ErrNotSupported }
func (linuxOps) InNetns(string, string) (bool, error)     { return false, ErrNotSupported }
func (linuxOps) PCIOfLink(string, string) (string, error) { return "", ErrNotSupported }
func (linuxOps) Move(string, string, string) error        { return ErrNotSupported }
