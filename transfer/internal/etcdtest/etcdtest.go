// Package etcdtest starts a real etcd server (go.etcd.io/etcd/server/v3/embed)
// in a test's process, for the transfer and kv tests of etcd metadata.
// The server runs its own goroutines until Close.
package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Start starts an etcd server in this process on a free loopback port
// (or port, when not 0) with its data in dir, and returns it and its
// client URL for MetadataAddr.
func Start(t testing.TB, dir string, port int) (*embed.Etcd, string, int) {
	t.Helper()
	free := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	if port == 0 {
		port = free()
	}
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", port))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", free()))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(20 * time.Second):
		e.Close()
		t.Fatal("etcd did not start")
	}
	return e, fmt.Sprintf("etcd://127.0.0.1:%d/test", port), port
}
