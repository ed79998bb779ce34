// CoreDNS with only the plugins the local cluster needs: the kubernetes plugin answers the
// headless-service and pod names of process-node pods from the real API server.
// This is CoreDNS's documented way to choose plugins at compile time (a main package that sets
// dnsserver.Directives and imports the plugins); it keeps the build small on two cores.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

var directives = []string{"errors", "log", "health", "ready", "kubernetes"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
