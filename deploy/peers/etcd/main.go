// Command etcd runs a single-member etcd server from go.etcd.io/etcd/server/v3/embed: the store a
// real kube-apiserver needs in tests. Its flags keep etcd's own names; each URL list is both
// listened on and advertised. It prints "ready" on stdout once the server serves clients, and
// stops cleanly on SIGINT or SIGTERM.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	name := flag.String("name", "default", "member name")
	dataDir := flag.String("data-dir", "", "data directory (required)")
	clientURLs := flag.String("listen-client-urls", "http://127.0.0.1:2379", "comma-separated client URLs, listened on and advertised")
	peerURLs := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "comma-separated peer URLs, listened on and advertised")
	logLevel := flag.String("log-level", "warn", "debug, info, warn or error")
	noFsync := flag.Bool("unsafe-no-fsync", false, "skip fsync (throw-away test data only)")
	startTimeout := flag.Duration("start-timeout", time.Minute, "give up when the server is not ready by then")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()

	if *showVersion {
		fmt.Printf("etcd Version: %s (embed launcher)\n", version.Version)
		return
	}
	if *dataDir == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: etcd --data-dir DIR [--listen-client-urls URLS] [--listen-peer-urls URLS] ...")
		flag.PrintDefaults()
		os.Exit(2)
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = mustURLs("listen-client-urls", *clientURLs)
	cfg.AdvertiseClientUrls = cfg.ListenClientUrls
	cfg.ListenPeerUrls = mustURLs("listen-peer-urls", *peerURLs)
	cfg.AdvertisePeerUrls = cfg.ListenPeerUrls
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = *logLevel
	cfg.UnsafeNoFsync = *noFsync

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fail("start: %v", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Println("ready")
	case <-time.After(*startTimeout):
		e.Server.Stop()
		fail("not ready after %s", *startTimeout)
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-stop:
	case err := <-e.Err():
		fail("serve: %v", err)
	}
}

func mustURLs(flagName, list string) []url.URL {
	var out []url.URL
	for _, s := range strings.Split(list, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || u.Scheme == "" || u.Host == "" {
			fail("--%s: %q is not a URL like http://127.0.0.1:2379", flagName, s)
		}
		out = append(out, *u)
	}
	return out
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "etcd: "+format+"\n", args...)
	os.Exit(1)
}
