package brokerimage_test

import (
	"context"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/ringfence/ringfence/internal/brokerimage"
	"github.com/ringfence/ringfence/internal/brokertest"
)

// TestBuildAndPrune builds two images of one spec from the Docker API and
// checks that pruning keeps only the one asked for.
func TestBuildAndPrune(t *testing.T) {
	cli := brokertest.RequireDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := brokerimage.Spec{Name: "ringfence-brokerimage-test"}
	old, cur := s.Name+":old", s.Name+":cur"
	t.Cleanup(func() {
		for _, ref := range []string{old, cur} {
			_, _ = cli.ImageRemove(context.Background(), ref, client.ImageRemoveOptions{PruneChildren: true})
		}
	})
	if err := brokerimage.BuildForTest(ctx, cli, s, []byte("binary one"), old); err != nil {
		t.Fatal(err)
	}
	if err := brokerimage.BuildForTest(ctx, cli, s, []byte("binary two"), cur); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{old, cur} {
		if _, err := cli.ImageInspect(ctx, ref); err != nil {
			t.Fatalf("built %s but cannot inspect it: %v", ref, err)
		}
	}
	brokerimage.PruneOthersForTest(ctx, cli, s, cur)
	if _, err := cli.ImageInspect(ctx, old); err == nil {
		t.Errorf("%s survived pruning", old)
	}
	if _, err := cli.ImageInspect(ctx, cur); err != nil {
		t.Errorf("%s was pruned: %v", cur, err)
	}
}
