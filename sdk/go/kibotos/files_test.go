//go:build dataplane

package kibotos_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"github.com/kibo-dev/kibo/sdk/go/kibotos"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Stat, list, make, move and remove, anywhere in the guest's tree; paths checked with
// INVALID_ARGUMENT naming the field.
func TestDataPlaneFiles(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	credential := guest(ctx, t, client)
	base := "/tmp/go-files"

	if err := client.MakeWorkspaceDirectory(ctx, &ctrlv1.MakeWorkspaceDirectoryRequest{Credential: credential, Path: base + "/a/b", Parents: true}); err != nil {
		t.Fatal(err)
	}
	if err := client.MakeWorkspaceDirectory(ctx, &ctrlv1.MakeWorkspaceDirectoryRequest{Credential: credential, Path: base + "/a/b", Parents: true}); err != nil {
		t.Fatalf("with parents, an existing directory is no error: %v", err)
	}
	if err := client.MakeWorkspaceDirectory(ctx, &ctrlv1.MakeWorkspaceDirectoryRequest{Credential: credential, Path: base + "/x/y"}); !errors.As(err, &kibotos.NotFoundError{}) {
		t.Fatalf("without parents, a missing parent: want NotFoundError, got %v", err)
	}
	if _, err := client.UploadFile(ctx, credential, base+"/a/b/hello.txt", strings.NewReader("hello"), kibotos.UploadMode(0o600)); err != nil {
		t.Fatal(err)
	}
	sh(ctx, t, client, credential, "ln -s hello.txt "+base+"/a/b/link")

	info, err := client.StatWorkspacePath(ctx, credential, base+"/a/b/hello.txt")
	if err != nil {
		t.Fatal(err)
	}
	if info.GetType() != ctrlv1.FileType_FILE_TYPE_FILE || info.GetSize() != 5 || info.GetMode()&0o7777 != 0o600 ||
		info.GetName() != "hello.txt" || info.GetPath() != base+"/a/b/hello.txt" || info.GetOwner() != "root" || info.GetModifyTime() == nil {
		t.Fatalf("stat hello.txt: %v", info)
	}
	link, err := client.StatWorkspacePath(ctx, credential, base+"/a/b/link")
	if err != nil || link.GetType() != ctrlv1.FileType_FILE_TYPE_SYMLINK || link.GetSymlinkTarget() != "hello.txt" {
		t.Fatalf("stat of a symlink describes the link: %v %v", link, err)
	}

	entries, truncated, err := client.ListWorkspaceDirectory(ctx, credential, base, 0)
	if err != nil || truncated || strings.Join(paths(entries), " ") != base+"/a" {
		t.Fatalf("list, depth 1: %v truncated %t %v", paths(entries), truncated, err)
	}
	entries, _, err = client.ListWorkspaceDirectory(ctx, credential, base, 3)
	want := []string{base + "/a", base + "/a/b", base + "/a/b/hello.txt", base + "/a/b/link"}
	if err != nil || strings.Join(paths(entries), " ") != strings.Join(want, " ") {
		t.Fatalf("list, depth 3: %v %v", paths(entries), err)
	}
	for _, entry := range entries {
		if entry.GetPath() == base+"/a/b" && entry.GetType() != ctrlv1.FileType_FILE_TYPE_DIRECTORY {
			t.Fatalf("a/b listed as %v", entry.GetType())
		}
	}

	if err := client.MoveWorkspacePath(ctx, credential, base+"/a/b/hello.txt", base+"/moved.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StatWorkspacePath(ctx, credential, base+"/a/b/hello.txt"); !errors.As(err, &kibotos.NotFoundError{}) {
		t.Fatalf("stat after the move: want NotFoundError, got %v", err)
	}
	var moved bytes.Buffer
	if _, err := client.DownloadFile(ctx, credential, base+"/moved.txt", &moved); err != nil || moved.String() != "hello" {
		t.Fatalf("the moved file: %q %v", moved.String(), err)
	}
	// Removing a symlink leaves what it points to.
	sh(ctx, t, client, credential, "ln -s moved.txt "+base+"/to-moved")
	if err := client.RemoveWorkspacePath(ctx, credential, base+"/to-moved", false); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StatWorkspacePath(ctx, credential, base+"/moved.txt"); err != nil {
		t.Fatalf("the symlink's target after the link's removal: %v", err)
	}
	if err := client.RemoveWorkspacePath(ctx, credential, base+"/a", false); err == nil {
		t.Fatal("removing a directory that is not empty without recursive succeeded")
	}
	if err := client.RemoveWorkspacePath(ctx, credential, base+"/a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StatWorkspacePath(ctx, credential, base+"/a"); !errors.As(err, &kibotos.NotFoundError{}) {
		t.Fatalf("stat after the recursive remove: want NotFoundError, got %v", err)
	}

	for _, c := range []struct {
		field string
		call  func() error
	}{
		{"path", func() error { _, err := client.StatWorkspacePath(ctx, credential, "relative/path"); return err }},
		{"path", func() error { _, err := client.StatWorkspacePath(ctx, credential, base+"/nul\x00byte"); return err }},
		{"path", func() error {
			_, err := client.StatWorkspacePath(ctx, credential, "/"+strings.Repeat("a", 4096))
			return err
		}},
		{"source", func() error { return client.MoveWorkspacePath(ctx, credential, "", base+"/x") }},
		{"destination", func() error { return client.MoveWorkspacePath(ctx, credential, base+"/moved.txt", "x") }},
	} {
		var invalid kibotos.InvalidArgumentError
		if err := c.call(); !errors.As(err, &invalid) || invalid.Field() != c.field {
			t.Errorf("want InvalidArgumentError on %s, got %v", c.field, err)
		}
	}
}

func paths(entries []*ctrlv1.FileInfo) []string {
	var all []string
	for _, entry := range entries {
		all = append(all, entry.GetPath())
	}
	sort.Strings(all)
	return all
}

func sha(content []byte) string {
	sum := sha256.Sum256(content)
	return hex.EncodeToString(sum[:])
}

// random is n bytes of seeded noise (incompressible, the same each run).
func random(n int) []byte {
	content := make([]byte, n)
	rand.New(rand.NewSource(int64(n))).Read(content)
	return content
}

// A few MiB up and down in 2 MiB parts with equal sha256 (here, in the guest, and back), a
// download from an offset, a replaced file, a size that is a whole number of parts, and a
// failed upload that leaves nothing in the guest.
func TestDataPlaneUploadDownload(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	credential := guest(ctx, t, client)

	content := random(5<<20 + 12345)
	var progress []int64
	size, err := client.UploadFile(ctx, credential, "/tmp/go-big/blob", bytes.NewReader(content),
		kibotos.UploadParents(), kibotos.UploadProgress(func(taken int64) { progress = append(progress, taken) }))
	if err != nil {
		t.Fatal(err)
	}
	if size != int64(len(content)) || fmt.Sprint(progress) != fmt.Sprint([]int64{2 << 20, 4 << 20, int64(len(content))}) {
		t.Fatalf("uploaded %d bytes, progress %v", size, progress)
	}
	if got := strings.Fields(string(sh(ctx, t, client, credential, "sha256sum /tmp/go-big/blob")))[0]; got != sha(content) {
		t.Fatalf("sha256 in the guest %s, sent %s", got, sha(content))
	}
	var down bytes.Buffer
	info, err := client.DownloadFile(ctx, credential, "/tmp/go-big/blob", &down)
	if err != nil || info.GetSize() != int64(len(content)) || sha(down.Bytes()) != sha(content) {
		t.Fatalf("download: %d bytes (described %d), equal %t, %v", down.Len(), info.GetSize(), sha(down.Bytes()) == sha(content), err)
	}
	tail, err := client.DownloadWorkspaceFile(ctx, &ctrlv1.DownloadWorkspaceFileRequest{Credential: credential, Path: "/tmp/go-big/blob", Offset: 3 << 20})
	if err != nil {
		t.Fatal(err)
	}
	read, err := io.ReadAll(tail)
	_ = tail.Close()
	if err != nil || !bytes.Equal(read, content[3<<20:]) {
		t.Fatalf("from offset 3 MiB: %d bytes, %v", len(read), err)
	}

	// Replaced whole, by a file of exactly two 1 MiB parts (the finish is a part of its own).
	replacement := random(2 << 20)
	progress = nil
	if _, err := client.UploadFile(ctx, credential, "/tmp/go-big/blob", bytes.NewReader(replacement), kibotos.UploadPartSize(1<<20),
		kibotos.UploadProgress(func(taken int64) { progress = append(progress, taken) })); err != nil {
		t.Fatal(err)
	}
	down.Reset()
	if _, err := client.DownloadFile(ctx, credential, "/tmp/go-big/blob", &down); err != nil || sha(down.Bytes()) != sha(replacement) {
		t.Fatalf("the replaced file: %d bytes, %v", down.Len(), err)
	}
	if fmt.Sprint(progress) != fmt.Sprint([]int64{1 << 20, 2 << 20, 2 << 20}) {
		t.Fatalf("progress of two whole parts: %v", progress)
	}

	// A reader that fails half-way: the error is the reader's, and the upload is cancelled,
	// leaving nothing: no file, and no upload holding one of the workspace's 4 (more such
	// uploads than that in a row would meet the cap were they left to their idle timeout).
	for i := 0; i < 5; i++ {
		broken := io.MultiReader(bytes.NewReader(random(3<<20)), failingReader{})
		if _, err := client.UploadFile(ctx, credential, "/tmp/go-half/never", broken, kibotos.UploadParents()); !errors.Is(err, errReader) {
			t.Fatalf("failed upload %d: want the reader's error, got %v", i+1, err)
		}
	}
	if _, err := client.StatWorkspacePath(ctx, credential, "/tmp/go-half/never"); !errors.As(err, &kibotos.NotFoundError{}) {
		t.Fatalf("a failed upload's file: want NotFoundError, got %v", err)
	}
	if entries, _, err := client.ListWorkspaceDirectory(ctx, credential, "/tmp/go-half", 1); err != nil || len(entries) != 0 {
		t.Fatalf("left beside the failed uploads' file: %v %v", paths(entries), err)
	}
	if _, err := client.UploadFile(ctx, credential, "/tmp/go-half/after", strings.NewReader("after")); err != nil {
		t.Fatalf("an upload after the failed ones: %v", err)
	}
}

// An upload the guest cannot take answers with its own error, not as if the part were misplaced:
// without parents, a missing directory is a NotFoundError, whichever part meets it (the first,
// small; or a later one, the guest's job having died meanwhile).
func TestDataPlaneUploadError(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	credential := guest(ctx, t, client)

	for i, content := range [][]byte{[]byte("x"), random(5 << 20)} {
		path := fmt.Sprintf("/tmp/go-none-%d/file", i)
		if _, err := client.UploadFile(ctx, credential, path, bytes.NewReader(content)); !errors.As(err, &kibotos.NotFoundError{}) {
			t.Errorf("upload of %d bytes under a missing directory: want NotFoundError, got %v", len(content), err)
		}
	}
}

var errReader = errors.New("the reader broke")

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errReader }

// lostAnswer loses the answer of the second WriteWorkspaceUpload (the server took the part)
// and records the codes of the calls that follow.
type lostAnswer struct {
	mu    sync.Mutex
	calls int
	codes []codes.Code
}

func (l *lostAnswer) intercept(ctx context.Context, method string, req, reply interface{}, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if method != "/kibo.ctrl.v1.DataPlaneService/WriteWorkspaceUpload" {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	l.codes = append(l.codes, status.Code(err))
	if l.calls == 2 && err == nil {
		return status.Error(codes.Unavailable, "test: the answer was lost")
	}
	return err
}

// brokenDownload acts on DownloadWorkspaceFile streams: the next one breaks (UNAVAILABLE) after
// its second message (the info and one part) when breakNext is set, calling onBreak first;
// with cut, every stream ends (io.EOF, no error) after its first, the info. It records each
// call's offset.
type brokenDownload struct {
	mu        sync.Mutex
	offsets   []int64
	breakNext bool
	onBreak   func()
	cut       bool
}

func (b *brokenDownload) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	stream, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/kibo.ctrl.v1.DataPlaneService/DownloadWorkspaceFile" {
		return stream, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	breaks := b.breakNext
	b.breakNext = false
	return &breakingStream{ClientStream: stream, owner: b, breaks: breaks, cut: b.cut}, nil
}

type breakingStream struct {
	grpc.ClientStream
	owner    *brokenDownload
	breaks   bool
	cut      bool
	received int
}

func (s *breakingStream) SendMsg(m interface{}) error {
	s.owner.mu.Lock()
	s.owner.offsets = append(s.owner.offsets, m.(*ctrlv1.DownloadWorkspaceFileRequest).GetOffset())
	s.owner.mu.Unlock()
	return s.ClientStream.SendMsg(m)
}

func (s *breakingStream) RecvMsg(m interface{}) error {
	if s.breaks && s.received == 2 {
		if s.owner.onBreak != nil {
			s.owner.onBreak()
		}
		return status.Error(codes.Unavailable, "test: the stream broke")
	}
	if s.cut && s.received == 1 {
		return io.EOF
	}
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.received++
	}
	return err
}

// A lost answer to an upload part: the part is sent again, the server refuses it naming the
// offset it took, and the upload goes on from there. A broken download goes on from the bytes
// written. Both end with the sha256 of what was sent. A download is not resumed over a file
// that changed meanwhile, and one cut short is an error, not a shorter file.
func TestDataPlaneTransferResume(t *testing.T) {
	ctx := testContext(t)
	lost, broken := &lostAnswer{}, &brokenDownload{}
	client := connect(t, kibotos.WithDialOptions(grpc.WithChainUnaryInterceptor(lost.intercept), grpc.WithChainStreamInterceptor(broken.intercept)))
	credential := guest(ctx, t, client)

	content := random(5<<20 + 1)
	if size, err := client.UploadFile(ctx, credential, "/tmp/resumed", bytes.NewReader(content)); err != nil || size != int64(len(content)) {
		t.Fatalf("upload with a lost answer: %d, %v", size, err)
	}
	// Part 1, part 2 (its answer lost), part 2 again (refused: taken), part 3 (with the finish).
	if fmt.Sprint(lost.codes) != fmt.Sprint([]codes.Code{codes.OK, codes.OK, codes.FailedPrecondition, codes.OK}) {
		t.Fatalf("the upload's calls: %v", lost.codes)
	}
	if got := strings.Fields(string(sh(ctx, t, client, credential, "sha256sum /tmp/resumed")))[0]; got != sha(content) {
		t.Fatalf("sha256 in the guest %s, sent %s", got, sha(content))
	}

	var down bytes.Buffer
	broken.breakNext = true
	if _, err := client.DownloadFile(ctx, credential, "/tmp/resumed", &down); err != nil || sha(down.Bytes()) != sha(content) {
		t.Fatalf("download with a broken stream: %d bytes, %v", down.Len(), err)
	}
	if len(broken.offsets) != 2 || broken.offsets[0] != 0 || broken.offsets[1] <= 0 || broken.offsets[1] >= int64(len(content)) {
		t.Fatalf("the download's calls from offsets %v", broken.offsets)
	}
	// The file replaced (by a larger one) while the stream was broken: not resumed into a mix of
	// the two.
	plain := connect(t)
	broken.breakNext = true
	broken.onBreak = func() {
		if _, err := plain.UploadFile(ctx, credential, "/tmp/resumed", bytes.NewReader(random(6<<20))); err != nil {
			t.Error(err)
		}
	}
	down.Reset()
	if _, err := client.DownloadFile(ctx, credential, "/tmp/resumed", &down); !errors.As(err, &kibotos.ConflictError{}) {
		t.Fatalf("a download whose file changed while it was broken: want ConflictError, got %v (%d bytes)", err, down.Len())
	}
	// A stream that ends short of the size described is not a whole file.
	broken.onBreak, broken.cut = nil, true
	if _, err := client.DownloadFile(ctx, credential, "/tmp/resumed", io.Discard); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a download cut short: want io.ErrUnexpectedEOF, got %v", err)
	}
	broken.cut = false

	// The offset the refusal names, read by UploadOffset, is the bytes taken.
	id, err := client.StartWorkspaceUpload(ctx, &ctrlv1.StartWorkspaceUploadRequest{Credential: credential, Path: "/tmp/twice"})
	if err != nil {
		t.Fatal(err)
	}
	defer client.CancelWorkspaceUpload(context.Background(), credential, id)
	part := &ctrlv1.WriteWorkspaceUploadRequest{Credential: credential, UploadId: id, Data: []byte("0123456789")}
	if reply, err := client.WriteWorkspaceUpload(ctx, part); err != nil || reply.GetSize() != 10 || reply.GetFinished() {
		t.Fatalf("a first part: %v %v", reply, err)
	}
	_, err = client.WriteWorkspaceUpload(ctx, part)
	if offset, ok := kibotos.UploadOffset(err); !errors.As(err, &kibotos.ConflictError{}) || !ok || offset != 10 {
		t.Fatalf("the part sent twice: want a ConflictError naming offset 10, got %v (offset %d, %t)", err, offset, ok)
	}
	if err := client.CancelWorkspaceUpload(ctx, credential, id); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StatWorkspacePath(ctx, credential, "/tmp/twice"); !errors.As(err, &kibotos.NotFoundError{}) {
		t.Fatalf("a cancelled upload's file: want NotFoundError, got %v", err)
	}
}

// A directory as a tar stream, both ways: a file, a subdirectory and a symlink kept as a link;
// an entry leading out of the directory is refused and nothing of it is made.
func TestDataPlaneArchive(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	credential := guest(ctx, t, client)

	big := random(3 << 20)
	var archive bytes.Buffer
	writer := tar.NewWriter(&archive)
	entries := []struct {
		header tar.Header
		body   []byte
	}{
		{tar.Header{Name: "sub/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "sub/notes.txt", Typeflag: tar.TypeReg, Mode: 0o640}, []byte("notes\n")},
		{tar.Header{Name: "big.bin", Typeflag: tar.TypeReg, Mode: 0o644}, big},
		{tar.Header{Name: "sub/link", Typeflag: tar.TypeSymlink, Linkname: "notes.txt"}, nil},
	}
	for _, entry := range entries {
		header := entry.header
		header.Size = int64(len(entry.body))
		header.ModTime = time.Unix(1700000000, 0)
		if err := writer.WriteHeader(&header); err != nil {
			t.Fatal(err)
		}
		if _, err := writer.Write(entry.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := writer.Close(); err != nil {
		t.Fatal(err)
	}
	if size, err := client.UploadArchive(ctx, credential, "/tmp/go-tree", bytes.NewReader(archive.Bytes())); err != nil || size != int64(archive.Len()) {
		t.Fatalf("upload of the tree: %d of %d, %v", size, archive.Len(), err)
	}
	link, err := client.StatWorkspacePath(ctx, credential, "/tmp/go-tree/sub/link")
	if err != nil || link.GetType() != ctrlv1.FileType_FILE_TYPE_SYMLINK || link.GetSymlinkTarget() != "notes.txt" {
		t.Fatalf("the unpacked symlink: %v %v", link, err)
	}
	if got := string(sh(ctx, t, client, credential, "cat /tmp/go-tree/sub/link; sha256sum < /tmp/go-tree/big.bin")); got != "notes\n"+sha(big)+"  -\n" {
		t.Fatalf("the unpacked files: %q", got)
	}

	var down bytes.Buffer
	if _, err := client.DownloadArchive(ctx, credential, "/tmp/go-tree", &down); err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	reader := tar.NewReader(&down)
	for {
		header, err := reader.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(reader)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(strings.TrimPrefix(header.Name, "./"), "go-tree/")
		switch header.Typeflag {
		case tar.TypeSymlink:
			found[name] = "-> " + header.Linkname
		case tar.TypeDir:
			found[strings.TrimSuffix(name, "/")+"/"] = "dir"
		case tar.TypeReg:
			found[name] = sha(body)
		}
	}
	if found["sub/link"] != "-> notes.txt" || found["sub/notes.txt"] != sha([]byte("notes\n")) || found["big.bin"] != sha(big) || found["sub/"] != "dir" {
		t.Fatalf("the downloaded tree: %v", found)
	}

	// An entry leading out of the directory: refused, nothing outside made.
	var escape bytes.Buffer
	writer = tar.NewWriter(&escape)
	_ = writer.WriteHeader(&tar.Header{Name: "../escaped.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	_, _ = writer.Write([]byte("out"))
	_ = writer.Close()
	if _, err := client.UploadArchive(ctx, credential, "/tmp/go-jail", bytes.NewReader(escape.Bytes())); err == nil {
		t.Fatal("an archive entry leading out of its directory was taken")
	}
	if _, err := client.StatWorkspacePath(ctx, credential, "/tmp/escaped.txt"); !errors.As(err, &kibotos.NotFoundError{}) {
		t.Fatalf("the escaping entry: want NotFoundError, got %v", err)
	}
}

// A recursive watch: ready first, then create, write, rename and remove in the order the
// guest's kernel saw them, in the directory and in a subdirectory.
func TestDataPlaneWatch(t *testing.T) {
	ctx := testContext(t)
	client := connect(t)
	credential := guest(ctx, t, client)
	base := "/tmp/go-watch"
	sh(ctx, t, client, credential, "mkdir -p "+base+"/sub")

	watch, err := client.WatchWorkspaceDirectory(ctx, credential, base, true)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	sh(ctx, t, client, credential, fmt.Sprintf("cd %s && echo x > a.txt && mv a.txt b.txt && rm b.txt && echo y > sub/c.txt", base))

	want := []string{
		"CREATE " + base + "/a.txt", "WRITE " + base + "/a.txt", "RENAME " + base + "/a.txt -> " + base + "/b.txt",
		"REMOVE " + base + "/b.txt", "CREATE " + base + "/sub/c.txt",
	}
	var seen []string
	timer := time.AfterFunc(20*time.Second, func() { _ = watch.Close() })
	defer timer.Stop()
	next := 0
	for next < len(want) {
		event, err := watch.Recv()
		if err != nil {
			t.Fatalf("watching (seen %v): %v", seen, err)
		}
		change, ok := event.(kibotos.FileChange)
		if !ok {
			t.Fatalf("watching (seen %v): %#v", seen, event)
		}
		text := strings.TrimPrefix(change.Type.String(), "FILE_EVENT_TYPE_") + " " + change.Path
		if change.NewPath != "" {
			text += " -> " + change.NewPath
		}
		seen = append(seen, text)
		// In order; other events between them (a second WRITE, a CHMOD) are allowed.
		if text == want[next] {
			next++
		}
	}
}
