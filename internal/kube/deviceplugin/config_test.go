package deviceplugin

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/internal/rdmafs"
)

func TestParseConfigErrors(t *testing.T) {
	for _, c := range []struct{ cfg, want string }{
		{``, "EOF"},
		{`{`, "unexpected EOF"},
		{`[]`, "cannot unmarshal"},
		{`{"configList":[]}`, "configList is empty"},
		{`{"configList":[{"rdmaHcaMax":1}]}`, "resourceName is missing"},
		{`{"configList":[{"resourceName":"a b","rdmaHcaMax":1}]}`, `resourceName "a b"`},
		{`{"configList":[{"resourceName":"a","resourcePrefix":"Rdma","rdmaHcaMax":1}]}`, "DNS subdomain"},
		{`{"configList":[{"resourceName":"a"}]}`, "rdmaHcaMax 0: shared mode needs"},
		{`{"configList":[{"resourceName":"a","rdmaHcaMax":100000}]}`, "rdmaHcaMax 100000"},
		{`{"configList":[{"resourceName":"a","mode":"exclusive","rdmaHcaMax":5}]}`, "rdmaHcaMax is for shared mode"},
		{`{"configList":[{"resourceName":"a","mode":"solo","rdmaHcaMax":5}]}`, `mode "solo"`},
		{`{"configList":[{"resourceName":"a","rdmaHcaMax":1},{"resourceName":"a","rdmaHcaMax":1}]}`, "configured twice"},
		{`{"configList":[{"resourceName":"a","rdmaHcaMax":1,"selectors":{"vendor":["15b3"]}}]}`, `unknown field "vendor"`},
		{`{"configList":[{"resourceName":"a","rdmaHcaMax":1,"selectors":{"vendors":["mellanox"]}}]}`, "4-digit hex"},
		{`{"configList":[{"resourceName":"a","rdmaHcaMax":1,"selectors":{"linkTypes":["roce2"]}}]}`, "ether, infiniband"},
		{`{"configList":[{"resourceName":"a","rdmaHcaMax":1,"selectors":{"ifNames":[""]}}]}`, "empty driver or interface"},
		{`{"periodicUpdateInterval":-1,"configList":[{"resourceName":"a","rdmaHcaMax":1}]}`, "periodicUpdateInterval"},
		{`{"configList":[{"resourceName":"a","rdmaHcaMax":1}]} {}`, "data after"},
	} {
		_, err := ParseConfig([]byte(c.cfg))
		if err == nil || !errors.Is(err, ErrConfig) && c.want != "EOF" || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.cfg, err, c.want)
		}
	}
}

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(`{"configList":[{"resourceName":"hca_shared_devices_a","rdmaHcaMax":1000,"devices":["ens2f0"],
		"selectors":{"vendors":["0x15B3"],"linkTypes":["Ether"]}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := c.ConfigList[0]
	if r.FullName() != "rdma/hca_shared_devices_a" || r.Mode != Shared || !slices.Equal(r.Selectors.IfNames, []string{"ens2f0"}) ||
		r.Selectors.Vendors[0] != "15b3" || r.Selectors.LinkTypes[0] != "ethernet" {
		t.Errorf("%+v", r)
	}
}

// Each kind of device in the cluster fixture, selected by each selector.
func TestSelectors(t *testing.T) {
	devs, err := Discover(rdmafs.FS{Root: filepath.Join("..", "..", "rdmafs", "testdata", "hosts", "cluster")})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sel  string
		want []string
	}{
		{`{}`, []string{"efa_0", "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "rxe0", "siw0"}},
		{`{"vendors":["15b3"],"linkTypes":["ether"]}`, []string{"mlx5_0", "mlx5_2", "mlx5_3"}},
		{`{"deviceIDs":["101e"]}`, []string{"mlx5_2", "mlx5_3"}},
		{`{"linkTypes":["infiniband"]}`, []string{"mlx5_1"}},
		{`{"drivers":["efa"]}`, []string{"efa_0"}},
		{`{"linkTypes":["unspecified"]}`, []string{"efa_0"}},
		{`{"drivers":["mlx5_core"],"ifNames":["eth0"]}`, []string{"mlx5_0"}},
		{`{"ifNames":["eth1","siw0"]}`, []string{"rxe0", "siw0"}},
		{`{"drivers":["rdma_rxe"]}`, []string{"rxe0"}},
		{`{"vendors":["8086"]}`, nil},
	} {
		c2, err := ParseConfig([]byte(`{"configList":[{"resourceName":"x","rdmaHcaMax":1,"selectors":` + c.sel + `}]}`))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range devs {
			if c2.ConfigList[0].Selectors.Selects(d) {
				got = append(got, d.Name)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.sel, got, c.want)
		}
	}
}

func TestMainBadConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "c.json")
	os.WriteFile(bad, []byte(`{"configList":[{"resourceName":"a"}]}`), 0o644)
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--config", bad}, 2, "rdmaHcaMax 0"},
		{[]string{"--config", filepath.Join(dir, "absent.json")}, 2, "no such file"},
		{[]string{"--bogus"}, 2, "flag provided but not defined"},
		{[]string{"extra"}, 2, "unexpected argument"},
	} {
		var out, errb bytes.Buffer
		if code := run(c.args, &out, &errb); code != c.code || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: %d %q", c.args, code, errb.String())
		}
	}
	good := filepath.Join(dir, "g.json")
	os.WriteFile(good, []byte(testConfig), 0o644)
	var out, errb bytes.Buffer
	root := filepath.Join("..", "..", "rdmafs", "testdata", "hosts", "cluster")
	if code := run([]string{"--config", good, "--root", root, "--check"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "resource rdma/vf mode=exclusive devices=2 mlx5_2 mlx5_3") ||
		!strings.Contains(out.String(), "allocate 0000:03:00.2: device /dev/infiniband/umad2") {
		t.Errorf("--check: %d %s %s", code, out.String(), errb.String())
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(testConfig))
	f.Add([]byte(`{"configList":[{"resourceName":"a","rdmaHcaMax":1,"devices":["x"],"selectors":{"linkTypes":["IB"]}}]}`))
	f.Add([]byte(`{"periodicUpdateInterval":5,"configList":[{"resourceName":"a","resourcePrefix":"x.y","mode":"exclusive"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		for _, r := range c.ConfigList {
			if r.ResourceName == "" || (r.Mode == Shared) == (r.RdmaHcaMax == 0) {
				t.Fatalf("accepted %+v", r)
			}
		}
	})
}
