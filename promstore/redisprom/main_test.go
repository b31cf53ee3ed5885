package redisprom_test

import (
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// The tests use the Redis server of internal/redistest (SLUICE_REDIS_URL,
// default redis://127.0.0.1:6379/15, else a private redis-server, stopped
// here when the tests end). With CI=true a missing server fails the tests
// instead of skipping them.
func TestMain(m *testing.M) { redistest.Main(m) }
