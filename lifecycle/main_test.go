package lifecycle_test

import (
	"os"
	"testing"

	"github.com/airlockdev/airlock/internal/lctest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	lctest.RemoveNetwork(lctest.Network)
	os.Exit(code)
}
