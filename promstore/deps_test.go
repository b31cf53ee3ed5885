package promstore_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestNoStoreClients: a program using promstore (with memstore) compiles no
// Redis or PostgreSQL client. Their metrics live in redisprom and pgprom.
func TestNoStoreClients(t *testing.T) {
	gobin, err := exec.LookPath("go") // go test puts its own go first on PATH
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no go command to list the dependencies (CI=true makes that a failure): %v", err)
		}
		t.Skipf("no go command to list the dependencies: %v", err)
	}
	out, err := exec.Command(gobin, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/redis/go-redis/",
			"github.com/jackc/pgx/",
			"github.com/sluicehq/sluice/redisstore",
			"github.com/sluicehq/sluice/pgstore",
		} {
			if strings.HasPrefix(pkg, banned) {
				t.Errorf("promstore depends on %s; only redisprom or pgprom may", pkg)
			}
		}
	}
}
