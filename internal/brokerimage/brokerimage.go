package brokerimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	gobuild "go/build"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/client"
)

// ErrBuild reports that an image could not be built.
var ErrBuild = errors.New("brokerimage: build failed")

// Spec says how to build one broker image.
type Spec struct {
	// Name is the image repository and the binary's file name.
	Name string
	// Package is the Go import path of the broker's main package.
	Package string
	// EnvOverride names the environment variable that, when set, names an
	// image to use instead of building one.
	EnvOverride string
	// Args are the image's default arguments (its CMD).
	Args []string
}

// Kafka is the kfake-based Kafka broker (listens on 9092, data in /data).
var Kafka = Spec{
	Name:        "ringfence-kfakebroker",
	Package:     "github.com/ringfence/ringfence/internal/cmd/kfakebroker",
	EnvOverride: "RINGFENCE_KAFKA_IMAGE",
}

// NATS is the real NATS server with JetStream (listens on 4222, store in
// /data).
var NATS = Spec{
	Name:        "ringfence-nats-server",
	Package:     "github.com/nats-io/nats-server/v2",
	EnvOverride: "RINGFENCE_NATS_IMAGE",
	Args:        []string{"-js", "-sd", "/data", "-p", "4222"},
}

// Image is a ready image.
type Image struct {
	// Ref is the image reference to run.
	Ref string
	// Override is true when Ref came from the spec's environment variable.
	Override bool
	// Built is true when this call built the image (false when reused).
	Built bool
	// BinaryTime and ImageTime are how long compiling and building took.
	BinaryTime, ImageTime time.Duration
}

// Ensure returns an image for s: the override from the environment if set,
// else an image tagged by the hash of a freshly compiled binary, built only
// when no image with that tag exists yet. dir is a directory inside the
// ringfence module (where `go build` resolves s.Package).
func Ensure(ctx context.Context, cli client.APIClient, s Spec, dir string) (Image, error) {
	if ref := os.Getenv(s.EnvOverride); ref != "" {
		return Image{Ref: ref, Override: true}, nil
	}
	tmp, err := os.MkdirTemp("", "brokerimage-")
	if err != nil {
		return Image{}, err
	}
	defer os.RemoveAll(tmp)

	start := time.Now()
	bin := filepath.Join(tmp, s.Name)
	if err := compile(ctx, s.Package, bin, dir); err != nil {
		return Image{}, err
	}
	img := Image{BinaryTime: time.Since(start)}
	binary, err := os.ReadFile(bin)
	if err != nil {
		return Image{}, err
	}
	sum := sha256.Sum256(binary)
	img.Ref = s.Name + ":" + hex.EncodeToString(sum[:8])

	if _, err := cli.ImageInspect(ctx, img.Ref); err == nil {
		return img, nil
	}
	start = time.Now()
	if err := build(ctx, cli, s, binary, img.Ref); err != nil {
		return Image{}, err
	}
	img.Built, img.ImageTime = true, time.Since(start)
	pruneOthers(ctx, cli, s, img.Ref)
	slog.Info("brokerimage: built", "image", img.Ref, "compile", img.BinaryTime, "build", img.ImageTime)
	return img, nil
}

// goTool returns the go command: the one on PATH, else the one in GOROOT
// (the environment's, else the toolchain's that built this binary, which
// for a test binary is the one that runs it).
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(gobuild.Default.GOROOT, "bin", "go")
}

func compile(ctx context.Context, pkg, out, dir string) error {
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if outb, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: go build %s: %v\n%s", ErrBuild, pkg, err, outb)
	}
	return nil
}

// Dockerfile returns the Dockerfile of the image for s.
func Dockerfile(s Spec) string {
	entry, _ := json.Marshal([]string{"/" + s.Name})
	df := "FROM scratch\n" +
		"COPY " + s.Name + " /" + s.Name + "\n" +
		"COPY data /data\n" +
		"COPY tmp /tmp\n" +
		"ENTRYPOINT " + string(entry) + "\n"
	if len(s.Args) > 0 {
		cmd, _ := json.Marshal(s.Args)
		df += "CMD " + string(cmd) + "\n"
	}
	return df
}

// buildContext returns the tar build context for s around binary.
func buildContext(s Spec, binary []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	now := time.Unix(0, 0)
	files := []struct {
		name string
		mode int64
		body []byte
	}{
		{"Dockerfile", 0o644, []byte(Dockerfile(s))},
		{s.Name, 0o755, binary},
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.body)), ModTime: now}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, err
		}
	}
	for _, d := range []string{"data/", "tmp/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: 0o1777, Typeflag: tar.TypeDir, ModTime: now}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func build(ctx context.Context, cli client.APIClient, s Spec, binary []byte, ref string) error {
	tarball, err := buildContext(s, binary)
	if err != nil {
		return err
	}
	res, err := cli.ImageBuild(ctx, bytes.NewReader(tarball), client.ImageBuildOptions{
		Tags:        []string{ref},
		Remove:      true,
		ForceRemove: true,
		Labels:      map[string]string{labelKey: s.Name},
	})
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBuild, ref, err)
	}
	defer res.Body.Close()
	return readBuildStream(res.Body, ref)
}

// labelKey marks the images this package builds, with the spec's name.
const labelKey = "org.ringfence.brokerimage"

// pruneOthers removes this spec's images other than keep, so that a changing
// binary does not pile up images. Images a container still uses are left
// alone (the engine refuses to remove them without force).
func pruneOthers(ctx context.Context, cli client.APIClient, s Spec, keep string) {
	res, err := cli.ImageList(ctx, client.ImageListOptions{Filters: make(client.Filters).Add("label", labelKey+"="+s.Name)})
	if err != nil {
		return
	}
	for _, im := range res.Items {
		if slices.Contains(im.RepoTags, keep) {
			continue
		}
		if _, err := cli.ImageRemove(ctx, im.ID, client.ImageRemoveOptions{PruneChildren: true}); err == nil {
			slog.Info("brokerimage: removed old image", "image", im.RepoTags)
		}
	}
}

// readBuildStream drains the daemon's JSON progress stream and returns the
// first error it reports (a build error arrives in the stream, not as an
// HTTP status).
func readBuildStream(r io.Reader, ref string) error {
	dec := json.NewDecoder(r)
	var log strings.Builder
	for {
		var m struct {
			Stream      string `json:"stream"`
			Error       string `json:"error"`
			ErrorDetail struct {
				Message string `json:"message"`
			} `json:"errorDetail"`
		}
		if err := dec.Decode(&m); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("%w: %s: reading build output: %v", ErrBuild, ref, err)
		}
		log.WriteString(m.Stream)
		if m.Error != "" || m.ErrorDetail.Message != "" {
			return fmt.Errorf("%w: %s: %s %s\n%s", ErrBuild, ref, m.Error, m.ErrorDetail.Message, log.String())
		}
	}
}
