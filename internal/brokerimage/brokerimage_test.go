package brokerimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestDockerfile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec Spec
		want string
	}{
		{"no args", Spec{Name: "b"}, "FROM scratch\nCOPY b /b\nCOPY data /data\nCOPY tmp /tmp\nENTRYPOINT [\"/b\"]\n"},
		{"args become CMD", Spec{Name: "n", Args: []string{"-js", "-sd", "/data"}},
			"FROM scratch\nCOPY n /n\nCOPY data /data\nCOPY tmp /tmp\nENTRYPOINT [\"/n\"]\nCMD [\"-js\",\"-sd\",\"/data\"]\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Dockerfile(tt.spec); got != tt.want {
				t.Errorf("Dockerfile:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestBuildContextHoldsBinaryDockerfileAndDirs(t *testing.T) {
	t.Parallel()
	s := Spec{Name: "bin"}
	tarball, err := buildContext(s, []byte("ELF"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	modes := map[string]int64{}
	tr := tar.NewReader(bytes.NewReader(tarball))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		got[h.Name] = string(body)
		modes[h.Name] = h.Mode
	}
	if got["Dockerfile"] != Dockerfile(s) {
		t.Errorf("Dockerfile entry = %q", got["Dockerfile"])
	}
	if got["bin"] != "ELF" || modes["bin"]&0o111 == 0 {
		t.Errorf("binary entry = %q mode %o, want executable ELF", got["bin"], modes["bin"])
	}
	for _, d := range []string{"data/", "tmp/"} {
		if _, ok := got[d]; !ok {
			t.Errorf("missing directory %s", d)
		}
	}
}

func TestReadBuildStream(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, stream string
		wantErr      bool
	}{
		{"ok", `{"stream":"Step 1/4 : FROM scratch\n"}{"stream":"Successfully built 1\n"}`, false},
		{"error in stream", `{"stream":"Step 1/4\n"}{"errorDetail":{"message":"COPY failed"},"error":"COPY failed"}`, true},
		{"garbage", `{"stream":`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := readBuildStream(strings.NewReader(tt.stream), "x:1")
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrBuild) {
				t.Errorf("err %v is not ErrBuild", err)
			}
		})
	}
}
