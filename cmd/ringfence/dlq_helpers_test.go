package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

// cli runs the command in-process and returns exit code, stdout, stderr.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

// jsonLines decodes JSON Lines output into values of T, checking that
// every line has the wanted type.
func jsonLines[T any](t *testing.T, out, typ string) []T {
	t.Helper()
	var got []T
	for _, line := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if line == "" {
			continue
		}
		var probe struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(line), &probe); err != nil || probe.Type != typ {
			t.Fatalf("line %q: type %q (%v), want %q", line, probe.Type, err, typ)
		}
		var v T
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		got = append(got, v)
	}
	return got
}

// lsJSON runs `ls --json` and returns its rows by raw tenant key.
func lsJSON(t *testing.T, base []string) map[string]lsLine {
	t.Helper()
	code, out, errs := cli(t, append([]string{"dlq", "ls", "--json"}, base...)...)
	if code != 0 {
		t.Fatalf("ls --json exit %d: %s %s", code, out, errs)
	}
	rows := map[string]lsLine{}
	for _, r := range jsonLines[lsLine](t, out, "tenant") {
		rows[rawKey(t, r.Tenant)] = r
	}
	return rows
}

// counts returns ls --json's count per raw tenant key.
func counts(t *testing.T, base []string) map[string]int {
	t.Helper()
	m := map[string]int{}
	for k, r := range lsJSON(t, base) {
		m[k] = r.Count
	}
	return m
}

func rawKey(t *testing.T, tn jsonTenant) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(tn.KeyBase64)
	if err != nil {
		t.Fatalf("tenant %+v: %v", tn, err)
	}
	return string(b)
}

func rawBytes(t *testing.T, b *jsonBytes) []byte {
	t.Helper()
	if b == nil {
		return nil
	}
	out, err := base64.StdEncoding.DecodeString(b.Base64)
	if err != nil {
		t.Fatalf("bytes %+v: %v", b, err)
	}
	return out
}
