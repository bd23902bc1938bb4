package doctor

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"time"
)

// RoCEv2Port is the UDP destination port of RoCE v2.
const RoCEv2Port = "4791"

func checkFirewall(d *doc) {
	roce := false
	for _, dev := range d.devs {
		for _, p := range dev.Ports {
			if !iwarp(dev) && p.LinkLayer == "Ethernet" {
				roce = true
			}
		}
	}
	if !roce {
		d.add("firewall", Skip, "firewall and UDP "+RoCEv2Port, "no RoCE port", "")
		return
	}
	mods, _ := d.fs.Modules()
	tables, _ := d.fs.ReadString("proc/net/ip_tables_names")
	tables6, _ := d.fs.ReadString("proc/net/ip6_tables_names")
	if !mods["nf_tables"] && tables == "" && tables6 == "" {
		d.add("firewall", Pass, "firewall", "no packet filter loaded: RoCE v2 (UDP "+RoCEv2Port+") passes", "")
		return
	}
	f := d.o.Ruleset
	if f == nil {
		if !d.o.live() || os.Geteuid() != 0 {
			d.add("firewall", Skip, "firewall and UDP "+RoCEv2Port, "a packet filter is loaded and its rules need root to read",
				"check as root that UDP "+RoCEv2Port+" is accepted: nft list ruleset | grep -n "+RoCEv2Port+" (or iptables-save)")
			return
		}
		f = liveRuleset
	}
	rules, err := f()
	if err != nil {
		d.add("firewall", Skip, "firewall and UDP "+RoCEv2Port, "cannot read the rules: "+err.Error(),
			"check that UDP "+RoCEv2Port+" is accepted: nft list ruleset | grep -n "+RoCEv2Port)
		return
	}
	st, detail := judgeRuleset(rules)
	fix := ""
	if st != Pass {
		fix = "accept RoCE v2: nft add rule inet filter input udp dport " + RoCEv2Port + " accept (or iptables -I INPUT -p udp --dport " + RoCEv2Port + " -j ACCEPT); RoCE v2 offloads bypass the host filter on most NICs but rxe goes through it"
	}
	d.add("firewall", st, "firewall and UDP "+RoCEv2Port, detail, fix)
}

// judgeRuleset reads nft or iptables-save text: a rule naming port 4791
// that drops or rejects fails; an input policy of drop without a rule
// accepting 4791 warns.
func judgeRuleset(rules string) (Status, string) {
	accepts := false
	inputDrop := false
	for _, line := range strings.Split(rules, "\n") {
		l := strings.ToLower(strings.TrimSpace(line))
		if strings.Contains(l, RoCEv2Port) {
			switch {
			case strings.Contains(l, "drop") || strings.Contains(l, "reject"):
				return Fail, "a rule drops UDP " + RoCEv2Port + ": " + strings.TrimSpace(line)
			case strings.Contains(l, "accept"):
				accepts = true
			}
		}
		if (strings.Contains(l, "hook input") && strings.Contains(l, "policy drop")) || strings.HasPrefix(l, ":input drop") {
			inputDrop = true
		}
	}
	switch {
	case accepts:
		return Pass, "UDP " + RoCEv2Port + " is accepted"
	case inputDrop:
		return Warn, "the input policy drops and no rule accepts UDP " + RoCEv2Port
	}
	return Pass, "no rule drops UDP " + RoCEv2Port
}

// liveRuleset runs nft, else iptables-save.
func liveRuleset() (string, error) {
	for _, cmd := range [][]string{{"nft", "list", "ruleset"}, {"iptables-save"}} {
		path, err := exec.LookPath(cmd[0])
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := exec.CommandContext(ctx, path, cmd[1:]...).Output()
		cancel()
		if err == nil {
			return string(out), nil
		}
	}
	return "", errors.New("neither nft nor iptables-save ran")
}
