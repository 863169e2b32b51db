package kibotos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"time"

	ctrlv1 "github.com/kibo-dev/kibo/sdk/go/gen/kibo/ctrl/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// The data plane's files: anywhere the guest's root reaches (its writable layer and its
// volumes), by absolute guest path, done inside the guest. Transfers are streams of parts of
// any total size: DownloadFile and UploadFile move a file between an io.Writer or io.Reader
// and the guest, resuming after a broken call; DownloadArchive and UploadArchive move a
// directory as a tar stream (symlinks kept as links).

// MaxUploadPart is the most one WriteWorkspaceUpload part carries (the server refuses more).
const MaxUploadPart = 2 << 20

// transferRetries is how many broken calls in a row (UNAVAILABLE, nothing moved between them)
// DownloadFile and UploadFile go on after; retryDelay the first pause, doubled each time.
const (
	transferRetries = 5
	retryDelay      = 100 * time.Millisecond
)

// StatWorkspacePath describes what is at path (a symlink is described, not followed).
func (c *Client) StatWorkspacePath(ctx context.Context, credential, path string) (*ctrlv1.FileInfo, error) {
	reply, err := c.dataPlane.StatWorkspacePath(ctx, &ctrlv1.StatWorkspacePathRequest{Credential: credential, Path: path})
	return reply.GetInfo(), err
}

// ListWorkspaceDirectory returns a directory's entries, depth levels down (0 or 1: its own
// entries; at most 32), and whether the listing was cut at 10,000 entries.
func (c *Client) ListWorkspaceDirectory(ctx context.Context, credential, path string, depth uint32) ([]*ctrlv1.FileInfo, bool, error) {
	reply, err := c.dataPlane.ListWorkspaceDirectory(ctx, &ctrlv1.ListWorkspaceDirectoryRequest{Credential: credential, Path: path, Depth: depth})
	return reply.GetEntries(), reply.GetTruncated(), err
}

// MakeWorkspaceDirectory makes a directory (request.Parents: its missing parents too, and no
// error when it exists; Mode 0: 0755).
func (c *Client) MakeWorkspaceDirectory(ctx context.Context, request *ctrlv1.MakeWorkspaceDirectoryRequest) error {
	_, err := c.dataPlane.MakeWorkspaceDirectory(ctx, request)
	return err
}

// MoveWorkspacePath renames a file or directory (replacing a file at destination).
func (c *Client) MoveWorkspacePath(ctx context.Context, credential, source, destination string) error {
	_, err := c.dataPlane.MoveWorkspacePath(ctx, &ctrlv1.MoveWorkspacePathRequest{Credential: credential, Source: source, Destination: destination})
	return err
}

// RemoveWorkspacePath removes a file, a symlink (not what it points to) or a directory
// (recursive: one that is not empty).
func (c *Client) RemoveWorkspacePath(ctx context.Context, credential, path string, recursive bool) error {
	_, err := c.dataPlane.RemoveWorkspacePath(ctx, &ctrlv1.RemoveWorkspacePathRequest{Credential: credential, Path: path, Recursive: recursive})
	return err
}

// Download is a file, or a directory as a tar stream, coming from a workspace: an
// io.ReadCloser (and io.WriterTo, so io.Copy moves each part as it comes). The guest reads as
// fast as this is read. Close it when done.
type Download struct {
	// Info describes what is downloaded (a file's whole size; an archive's is not known).
	Info *ctrlv1.FileInfo

	stream   ctrlv1.DataPlaneService_DownloadWorkspaceFileClient
	cancel   context.CancelFunc
	pending  []byte
	received int64
	// expect is the bytes a regular file's size promises from the offset; -1: not known.
	expect int64
	err    error
}

// DownloadWorkspaceFile opens the download of request.Path from request.Offset (a file), or of
// a directory as a tar stream (request.Archive), and returns once the server described it.
func (c *Client) DownloadWorkspaceFile(ctx context.Context, request *ctrlv1.DownloadWorkspaceFileRequest) (*Download, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.dataPlane.DownloadWorkspaceFile(ctx, request)
	if err != nil {
		cancel()
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		if errors.Is(err, io.EOF) {
			err = unavailable("the download's stream ended before it began")
		}
		return nil, err
	}
	info := first.GetInfo()
	if info == nil {
		cancel()
		return nil, InternalError{localError(codes.Internal, ctrlv1.ErrorReason_ERROR_REASON_UNSPECIFIED, "the download's stream did not begin with `info`", "")}
	}
	expect := int64(-1)
	if !request.GetArchive() && info.GetType() == ctrlv1.FileType_FILE_TYPE_FILE {
		expect = info.GetSize() - request.GetOffset()
	}
	return &Download{Info: info, stream: stream, cancel: cancel, expect: expect}, nil
}

// next receives the next part into d.pending; io.EOF at the end.
func (d *Download) next() error {
	if d.err != nil {
		return d.err
	}
	for len(d.pending) == 0 {
		message, err := d.stream.Recv()
		if errors.Is(err, io.EOF) && d.expect >= 0 && d.received < d.expect {
			// A file shorter than described: it was cut while it was read (or the stream was).
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			d.err = err
			d.cancel()
			return err
		}
		d.pending = message.GetData()
		d.received += int64(len(d.pending))
	}
	return nil
}

// Read reads the download's bytes; io.EOF at its end, io.ErrUnexpectedEOF when a file's
// stream ends short of the size Info described.
func (d *Download) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if err := d.next(); err != nil {
		return 0, err
	}
	n := copy(p, d.pending)
	d.pending = d.pending[n:]
	return n, nil
}

// WriteTo writes the rest of the download to w, each part as it comes.
func (d *Download) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if err := d.next(); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return total, err
		}
		n, err := w.Write(d.pending)
		total += int64(n)
		d.pending = d.pending[n:]
		if err != nil {
			d.cancel()
			return total, err
		}
	}
}

// Close ends the call (the guest stops reading). Idempotent.
func (d *Download) Close() error {
	d.cancel()
	return nil
}

// DownloadFile copies the file at path to w and returns its description. A call that breaks
// (UnavailableError) is made again from the bytes already written, as long as the file is
// unchanged (same size and modification time; else a ConflictError): up to 5 breaks in a row
// with nothing received between them.
func (c *Client) DownloadFile(ctx context.Context, credential, path string, w io.Writer) (*ctrlv1.FileInfo, error) {
	var info *ctrlv1.FileInfo
	var written int64
	breaks := 0
	for {
		download, err := c.DownloadWorkspaceFile(ctx, &ctrlv1.DownloadWorkspaceFileRequest{Credential: credential, Path: path, Offset: written})
		if err == nil {
			if info == nil {
				info = download.Info
			} else if download.Info.GetSize() != info.GetSize() || !proto.Equal(download.Info.GetModifyTime(), info.GetModifyTime()) {
				_ = download.Close()
				return info, ConflictError{localError(codes.FailedPrecondition, ctrlv1.ErrorReason_ERROR_REASON_CONFLICT,
					fmt.Sprintf("%s changed while it was downloaded (%d of %d bytes written): download it again", path, written, info.GetSize()), "path")}
			}
			var n int64
			n, err = download.WriteTo(w)
			_ = download.Close()
			written += n
			if err == nil {
				return info, nil
			}
			if n > 0 {
				breaks = 0
			}
		}
		if !errors.As(err, &UnavailableError{}) || breaks >= transferRetries {
			return info, err
		}
		if err := pause(ctx, breaks); err != nil {
			return info, err
		}
		breaks++
	}
}

// DownloadArchive writes the directory at path to w as an uncompressed tar stream (POSIX pax;
// symlinks kept as links) and returns the bytes written. Not resumed: the stream is made as
// it is read.
func (c *Client) DownloadArchive(ctx context.Context, credential, path string, w io.Writer) (int64, error) {
	download, err := c.DownloadWorkspaceFile(ctx, &ctrlv1.DownloadWorkspaceFileRequest{Credential: credential, Path: path, Archive: true})
	if err != nil {
		return 0, err
	}
	defer download.Close()
	return download.WriteTo(w)
}

// StartWorkspaceUpload opens an upload of a file (or, request.Archive, a tar stream unpacked
// into a directory) and returns its upload ID for WriteWorkspaceUpload. One not written for
// 60 s is cancelled.
func (c *Client) StartWorkspaceUpload(ctx context.Context, request *ctrlv1.StartWorkspaceUploadRequest) (string, error) {
	reply, err := c.dataPlane.StartWorkspaceUpload(ctx, request)
	return reply.GetUploadId(), err
}

// WriteWorkspaceUpload sends one part (at most MaxUploadPart bytes) at request.Offset, the
// bytes taken so far; request.Finish puts the upload in place whole. A part sent twice is a
// ConflictError naming the offset to go on from (UploadOffset reads it).
func (c *Client) WriteWorkspaceUpload(ctx context.Context, request *ctrlv1.WriteWorkspaceUploadRequest) (*ctrlv1.WriteWorkspaceUploadResponse, error) {
	return c.dataPlane.WriteWorkspaceUpload(ctx, request)
}

// CancelWorkspaceUpload abandons an upload: nothing of it is left in the guest.
func (c *Client) CancelWorkspaceUpload(ctx context.Context, credential, uploadID string) error {
	_, err := c.dataPlane.CancelWorkspaceUpload(ctx, &ctrlv1.CancelWorkspaceUploadRequest{Credential: credential, UploadId: uploadID})
	return err
}

// UploadOption sets an option of UploadFile and UploadArchive.
type UploadOption func(*uploadOptions)

type uploadOptions struct {
	mode     uint32
	parents  bool
	partSize int
	progress func(int64)
}

// UploadMode sets a new file's permission bits (default 0644).
func UploadMode(mode uint32) UploadOption { return func(o *uploadOptions) { o.mode = mode } }

// UploadParents makes the missing parent directories.
func UploadParents() UploadOption { return func(o *uploadOptions) { o.parents = true } }

// UploadPartSize sets the size of the parts sent (1 to MaxUploadPart; default MaxUploadPart).
func UploadPartSize(bytes int) UploadOption {
	return func(o *uploadOptions) {
		if bytes > 0 && bytes <= MaxUploadPart {
			o.partSize = bytes
		}
	}
}

// UploadProgress calls fn with the bytes the server has taken after each part.
func UploadProgress(fn func(taken int64)) UploadOption {
	return func(o *uploadOptions) { o.progress = fn }
}

// UploadFile creates or replaces the file at path with what r gives until io.EOF, in parts
// of at most MaxUploadPart, and returns its size. The file appears whole once all is taken,
// never half-written. A part whose call breaks (UnavailableError) is sent again; when the
// server had taken it, its refusal names the offset to go on from, and the upload goes on
// there. On any failure the upload is cancelled: nothing of it is left in the guest.
func (c *Client) UploadFile(ctx context.Context, credential, path string, r io.Reader, options ...UploadOption) (int64, error) {
	return c.upload(ctx, credential, path, false, r, options)
}

// UploadArchive unpacks the uncompressed tar stream r into the directory at path (made if
// missing): its files, directories and symlinks (entries leading out of it are refused). It
// returns the bytes of the stream taken. As UploadFile for the rest.
func (c *Client) UploadArchive(ctx context.Context, credential, path string, r io.Reader, options ...UploadOption) (int64, error) {
	return c.upload(ctx, credential, path, true, r, options)
}

func (c *Client) upload(ctx context.Context, credential, path string, archive bool, r io.Reader, options []UploadOption) (int64, error) {
	o := uploadOptions{partSize: MaxUploadPart}
	for _, option := range options {
		option(&o)
	}
	uploadID, err := c.StartWorkspaceUpload(ctx, &ctrlv1.StartWorkspaceUploadRequest{
		Credential: credential, Path: path, Mode: o.mode, Archive: archive, Parents: o.parents,
	})
	if err != nil {
		return 0, err
	}
	finished := false
	defer func() {
		if !finished {
			// ctx may be what ended: the cancel gets a few seconds of its own.
			cleanup, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.CancelWorkspaceUpload(cleanup, credential, uploadID)
		}
	}()
	buffer := make([]byte, o.partSize)
	var taken int64
	for {
		n, readErr := io.ReadFull(r, buffer)
		last := errors.Is(readErr, io.EOF) || errors.Is(readErr, io.ErrUnexpectedEOF)
		if readErr != nil && !last {
			return taken, readErr
		}
		reply, err := c.writePart(ctx, credential, uploadID, taken, buffer[:n], last)
		if err != nil {
			return taken, err
		}
		if reply.GetSize() != taken+int64(n) || reply.GetFinished() != last {
			return taken, InternalError{localError(codes.Internal, ctrlv1.ErrorReason_ERROR_REASON_UNSPECIFIED,
				fmt.Sprintf("the upload took %d bytes (finished %t) where %d were sent (finish %t)", reply.GetSize(), reply.GetFinished(), taken+int64(n), last), "")}
		}
		taken = reply.GetSize()
		if o.progress != nil {
			o.progress(taken)
		}
		if last {
			finished = true
			return taken, nil
		}
	}
}

// writePart sends part, which starts at offset start, resending it after a broken call and
// going on from the offset the server names when it had taken some or all of it.
func (c *Client) writePart(ctx context.Context, credential, uploadID string, start int64, part []byte, finish bool) (*ctrlv1.WriteWorkspaceUploadResponse, error) {
	from := start
	end := start + int64(len(part))
	breaks, resumes := 0, 0
	for {
		reply, err := c.WriteWorkspaceUpload(ctx, &ctrlv1.WriteWorkspaceUploadRequest{
			Credential: credential, UploadId: uploadID, Offset: from, Data: part[from-start:], Finish: finish,
		})
		if err == nil {
			return reply, nil
		}
		var conflict ConflictError
		if errors.As(err, &conflict) && breaks > 0 {
			// A resend the server had taken (some of): go on from what it took.
			taken, ok := UploadOffset(err)
			if !ok || taken < start || taken > end || taken == from || resumes > transferRetries {
				return nil, err
			}
			resumes++
			if taken == end && !finish {
				return &ctrlv1.WriteWorkspaceUploadResponse{Size: end}, nil
			}
			from = taken
			continue
		}
		if !errors.As(err, &UnavailableError{}) || breaks >= transferRetries {
			return nil, err
		}
		if err := pause(ctx, breaks); err != nil {
			return nil, err
		}
		breaks++
	}
}

// goOnFrom finds the offset a refused part's message says to go on from ("... it has taken
// 4194304 bytes; go on from offset 4194304"); the message names the refused offset too.
var goOnFrom = regexp.MustCompile(`\bgo on from offset (\d{1,19})\b`)

// UploadOffset is the offset to go on from that a refused WriteWorkspaceUpload names (the
// bytes the server has taken): a CONFLICT on the field "offset", whose ErrorInfo metadata
// "offset" gives it, else its message ("go on from offset N").
func UploadOffset(err error) (int64, bool) {
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Code != codes.FailedPrecondition || apiErr.Reason() != "CONFLICT" {
		return 0, false
	}
	if field := apiErr.Field(); field != "" && field != "offset" {
		return 0, false // another conflict: e.g. the upload has finished (field upload_id)
	}
	text, ok := apiErr.Info.GetMetadata()["offset"]
	if !ok {
		match := goOnFrom.FindStringSubmatch(apiErr.Message)
		if match == nil {
			return 0, false
		}
		text = match[1]
	}
	offset, parseErr := strconv.ParseInt(text, 10, 64)
	return offset, parseErr == nil && offset >= 0
}

// pause waits before the next try after `breaks` breaks, or until ctx ends.
func pause(ctx context.Context, breaks int) error {
	timer := time.NewTimer(retryDelay << breaks)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

func unavailable(message string) error {
	return UnavailableError{localError(codes.Unavailable, ctrlv1.ErrorReason_ERROR_REASON_UNAVAILABLE, message, "")}
}

// WatchEvent is one event of a DirectoryWatch: a FileChange, or a WatchOverflow. Tell them
// apart with a type switch.
type WatchEvent interface{ watchEvent() }

// FileChange is a change under the watched directory. For a rename, Path is the old name and
// NewPath the new one (empty when it moved out of the watch).
type FileChange struct {
	Type        ctrlv1.FileEventType
	Path        string
	NewPath     string
	IsDirectory bool
}

// WatchOverflow says the guest's kernel dropped events (its queue overflowed): rescan what
// matters.
type WatchOverflow struct{}

func (FileChange) watchEvent()    {}
func (WatchOverflow) watchEvent() {}

// DirectoryWatch streams the changes under a directory; Recv reads them (no goroutine, no
// channel). Close it when done.
type DirectoryWatch struct {
	stream ctrlv1.DataPlaneService_WatchWorkspaceDirectoryClient
	cancel context.CancelFunc
}

// WatchWorkspaceDirectory watches the directory at path (recursive: its subdirectories too,
// new ones included) and returns once the watch is in place: what happens from then on comes
// from Recv, in the order the guest's kernel saw it.
func (c *Client) WatchWorkspaceDirectory(ctx context.Context, credential, path string, recursive bool) (*DirectoryWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.dataPlane.WatchWorkspaceDirectory(ctx, &ctrlv1.WatchWorkspaceDirectoryRequest{Credential: credential, Path: path, Recursive: recursive})
	if err != nil {
		cancel()
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		if errors.Is(err, io.EOF) {
			err = unavailable("the watch's stream ended before it was in place")
		}
		return nil, err
	}
	if !first.GetReady() {
		cancel()
		return nil, InternalError{localError(codes.Internal, ctrlv1.ErrorReason_ERROR_REASON_UNSPECIFIED, "the watch's stream did not begin with `ready`", "")}
	}
	return &DirectoryWatch{stream: stream, cancel: cancel}, nil
}

// Recv returns the next event. The watch goes on until Close or its context ends; a stream
// that ends (the workspace stopped, the credential was revoked) gives that error, or io.EOF.
func (w *DirectoryWatch) Recv() (WatchEvent, error) {
	for {
		message, err := w.stream.Recv()
		if err != nil {
			w.cancel()
			return nil, err
		}
		switch e := message.GetEvent().(type) {
		case *ctrlv1.WatchWorkspaceDirectoryResponse_Change:
			return FileChange{Type: e.Change.GetType(), Path: e.Change.GetPath(), NewPath: e.Change.GetNewPath(), IsDirectory: e.Change.GetIsDirectory()}, nil
		case *ctrlv1.WatchWorkspaceDirectoryResponse_Overflow:
			return WatchOverflow{}, nil
		}
		// Unknown to this SDK (a newer server's event): skipped.
	}
}

// Close ends the watch. Idempotent; safe while another goroutine is in Recv.
func (w *DirectoryWatch) Close() error {
	w.cancel()
	return nil
}
