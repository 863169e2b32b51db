"""Every RPC kibo serves, bound to its handler: one table per proto service.

Both transports serve these tables (transport/grpc.py, transport/connect.py), so this is
where a method name leads to the code that answers it ("go to definition" on the handler;
for a command, on its entry in the registry, api/commands.py, which names its parser and
its engine handler).
`Service` checks each table against its proto when it is built: a method added to a proto
but not here, or with the wrong types, stops the server from starting (and the tests)."""

from __future__ import annotations

from kibo.ctrl.v1 import data_plane_service_pb2 as dp
from kibo.ctrl.v1 import observation_service_pb2 as obs
from kibo.ctrl.v1 import volume_service_pb2 as vol
from kibo.ctrl.v1 import workspace_service_pb2 as ws
from kibo.node.v1 import node_admin_service_pb2 as nadm
from kibo.node.v1 import node_guest_service_pb2 as ngu
from kibo.node.v1 import node_service_pb2 as nd
from kibo.node.v1 import node_storage_service_pb2 as nst
from kibo.sim.v1 import simulator_pb2 as sim

from .api.commands import VOLUME_COMMANDS, WORKSPACE_COMMANDS
from .api.control_plane import Api
from .api.data_plane import DataPlane
from .api.node_api import NodeAdminApi, NodeApi
from .api.node_certs import NodeCertificates, node_port_only, node_port_only_stream
from .api.node_guest_api import NodeGuestApi
from .api.node_storage_api import NodeStorageApi
from .runtime.sim.api import SimulatorApi
from .transport.rpc import BidiStream, Rpc, ServerStream, Service, Unary


def workspace_service(api: Api) -> Service:
    return Service(
        ws.DESCRIPTOR.services_by_name["WorkspaceService"],
        (
            Unary("GetWorkspace", ws.GetWorkspaceRequest, ws.GetWorkspaceResponse, api.get_workspace),
            Unary("ListWorkspaces", ws.ListWorkspacesRequest, ws.ListWorkspacesResponse, api.list_workspaces),
            Unary(
                "GetWorkspaceCommand",
                ws.GetWorkspaceCommandRequest,
                ws.GetWorkspaceCommandResponse,
                api.get_workspace_command,
            ),
            ServerStream("WatchWorkspace", ws.WatchWorkspaceRequest, ws.WatchWorkspaceResponse, api.watch_workspace),
            Unary("GetCapabilities", ws.GetCapabilitiesRequest, ws.GetCapabilitiesResponse, api.get_capabilities),
            Unary(
                "ListWorkspaceExposures",
                ws.ListWorkspaceExposuresRequest,
                ws.ListWorkspaceExposuresResponse,
                api.list_workspace_exposures,
            ),
            # The commands: each declared once, in the registry (api/commands.py).
            *(Unary(c.rpc, c.request, c.response, api.workspace_command(c)) for c in WORKSPACE_COMMANDS),
        ),
    )


def observation_service(api: Api) -> Service:
    return Service(
        obs.DESCRIPTOR.services_by_name["WorkspaceObservationService"],
        (
            Unary(
                "GetWorkspaceCleanup",
                obs.GetWorkspaceCleanupRequest,
                obs.GetWorkspaceCleanupResponse,
                api.get_workspace_cleanup,
            ),
            Unary(
                "ListWorkspaceEvents",
                obs.ListWorkspaceEventsRequest,
                obs.ListWorkspaceEventsResponse,
                api.list_workspace_events,
            ),
            Unary(
                "ListWorkspaceInstances",
                obs.ListWorkspaceInstancesRequest,
                obs.ListWorkspaceInstancesResponse,
                api.list_workspace_instances,
            ),
            Unary("ListEvents", obs.ListEventsRequest, obs.ListEventsResponse, api.list_events),
            ServerStream("WatchEvents", obs.WatchEventsRequest, obs.WatchEventsResponse, api.watch_events),
        ),
    )


def volume_service(api: Api) -> Service:
    return Service(
        vol.DESCRIPTOR.services_by_name["VolumeService"],
        (
            # The commands, from the registry (api/commands.py).
            *(Unary(c.rpc, c.request, c.response, api.volume_command(c)) for c in VOLUME_COMMANDS),
            Unary("GetVolume", vol.GetVolumeRequest, vol.GetVolumeResponse, api.get_volume),
        ),
    )


def data_plane_service(data_plane: DataPlane) -> Service:
    # A credential in the request authorizes exec and file calls: they need no token.
    return Service(
        dp.DESCRIPTOR.services_by_name["DataPlaneService"],
        (
            Unary(
                "IssueDataPlaneCredential",
                dp.IssueDataPlaneCredentialRequest,
                dp.IssueDataPlaneCredentialResponse,
                data_plane.issue_data_plane_credential,
            ),
            ServerStream(
                "ExecWorkspaceCommand",
                dp.ExecWorkspaceCommandRequest,
                dp.ExecWorkspaceCommandResponse,
                data_plane.exec_workspace_command,
                credential=True,
            ),
            Unary(
                "ReadWorkspaceFile",
                dp.ReadWorkspaceFileRequest,
                dp.ReadWorkspaceFileResponse,
                data_plane.read_workspace_file,
                credential=True,
            ),
            Unary(
                "WriteWorkspaceFile",
                dp.WriteWorkspaceFileRequest,
                dp.WriteWorkspaceFileResponse,
                data_plane.write_workspace_file,
                credential=True,
            ),
            ServerStream(
                "StartWorkspaceProcess",
                dp.StartWorkspaceProcessRequest,
                dp.StartWorkspaceProcessResponse,
                data_plane.processes.start_workspace_process,
                credential=True,
            ),
            ServerStream(
                "ConnectWorkspaceProcess",
                dp.ConnectWorkspaceProcessRequest,
                dp.ConnectWorkspaceProcessResponse,
                data_plane.processes.connect_workspace_process,
                credential=True,
            ),
            Unary(
                "ListWorkspaceProcesses",
                dp.ListWorkspaceProcessesRequest,
                dp.ListWorkspaceProcessesResponse,
                data_plane.processes.list_workspace_processes,
                credential=True,
            ),
            Unary(
                "SendWorkspaceProcessInput",
                dp.SendWorkspaceProcessInputRequest,
                dp.SendWorkspaceProcessInputResponse,
                data_plane.processes.send_workspace_process_input,
                credential=True,
            ),
            Unary(
                "SignalWorkspaceProcess",
                dp.SignalWorkspaceProcessRequest,
                dp.SignalWorkspaceProcessResponse,
                data_plane.processes.signal_workspace_process,
                credential=True,
            ),
            Unary(
                "ResizeWorkspaceProcess",
                dp.ResizeWorkspaceProcessRequest,
                dp.ResizeWorkspaceProcessResponse,
                data_plane.processes.resize_workspace_process,
                credential=True,
            ),
            Unary(
                "StatWorkspacePath",
                dp.StatWorkspacePathRequest,
                dp.StatWorkspacePathResponse,
                data_plane.files.stat_workspace_path,
                credential=True,
            ),
            Unary(
                "ListWorkspaceDirectory",
                dp.ListWorkspaceDirectoryRequest,
                dp.ListWorkspaceDirectoryResponse,
                data_plane.files.list_workspace_directory,
                credential=True,
            ),
            Unary(
                "MakeWorkspaceDirectory",
                dp.MakeWorkspaceDirectoryRequest,
                dp.MakeWorkspaceDirectoryResponse,
                data_plane.files.make_workspace_directory,
                credential=True,
            ),
            Unary(
                "MoveWorkspacePath",
                dp.MoveWorkspacePathRequest,
                dp.MoveWorkspacePathResponse,
                data_plane.files.move_workspace_path,
                credential=True,
            ),
            Unary(
                "RemoveWorkspacePath",
                dp.RemoveWorkspacePathRequest,
                dp.RemoveWorkspacePathResponse,
                data_plane.files.remove_workspace_path,
                credential=True,
            ),
            ServerStream(
                "DownloadWorkspaceFile",
                dp.DownloadWorkspaceFileRequest,
                dp.DownloadWorkspaceFileResponse,
                data_plane.files.download_workspace_file,
                credential=True,
            ),
            Unary(
                "StartWorkspaceUpload",
                dp.StartWorkspaceUploadRequest,
                dp.StartWorkspaceUploadResponse,
                data_plane.files.start_workspace_upload,
                credential=True,
            ),
            Unary(
                "WriteWorkspaceUpload",
                dp.WriteWorkspaceUploadRequest,
                dp.WriteWorkspaceUploadResponse,
                data_plane.files.write_workspace_upload,
                credential=True,
            ),
            Unary(
                "CancelWorkspaceUpload",
                dp.CancelWorkspaceUploadRequest,
                dp.CancelWorkspaceUploadResponse,
                data_plane.files.cancel_workspace_upload,
                credential=True,
            ),
            ServerStream(
                "WatchWorkspaceDirectory",
                dp.WatchWorkspaceDirectoryRequest,
                dp.WatchWorkspaceDirectoryResponse,
                data_plane.files.watch_workspace_directory,
                credential=True,
            ),
        ),
    )


def simulator_service(simulator: SimulatorApi) -> Service:
    # Served only with --runtime sim (app.py builds SimulatorApi only there).
    return Service(
        sim.DESCRIPTOR.services_by_name["SimulatorService"],
        (Unary("InjectFault", sim.InjectFaultRequest, sim.InjectFaultResponse, simulator.inject_fault),),
    )


def node_service(nodes: NodeApi, certificates: NodeCertificates, port: str = "plaintext") -> Service:
    # What node agents call (kibo-ctrl node): gRPC only, with the node authenticator (app.py).
    # `port`: "node" (mutual TLS: everything, renewal), "main" (a mutual-TLS cluster's main
    # port: the bootstrap only) or "plaintext" (--insecure-node-link: everything, as before).
    if port == "main":
        return _node_bootstrap_only(certificates)
    issue = certificates.renew if port == "node" else certificates.bootstrap
    return Service(
        nd.DESCRIPTOR.services_by_name["NodeService"],
        (
            Unary("IssueNodeCertificate", nd.IssueNodeCertificateRequest, nd.IssueNodeCertificateResponse, issue),
            Unary("Join", nd.JoinRequest, nd.JoinResponse, nodes.join),
            ServerStream("WatchSteps", nd.WatchStepsRequest, nd.WatchStepsResponse, nodes.watch_steps),
            Unary("GetLaunchSpec", nd.GetLaunchSpecRequest, nd.GetLaunchSpecResponse, nodes.get_launch_spec),
            Unary("Report", nd.ReportRequest, nd.ReportResponse, nodes.report),
            Unary("ReportBatch", nd.ReportBatchRequest, nd.ReportBatchResponse, nodes.report_batch),
            Unary(
                "ReportStorageReleased",
                nd.ReportStorageReleasedRequest,
                nd.ReportStorageReleasedResponse,
                nodes.report_storage_released,
            ),
            Unary(
                "ReportVolumeReleased",
                nd.ReportVolumeReleasedRequest,
                nd.ReportVolumeReleasedResponse,
                nodes.report_volume_released,
            ),
            Unary("RenewLease", nd.RenewLeaseRequest, nd.RenewLeaseResponse, nodes.renew_lease),
        ),
    )


def _node_bootstrap_only(certificates: NodeCertificates) -> Service:
    """NodeService on a mutual-TLS cluster's main port: IssueNodeCertificate, and every other
    method refused, naming the node port (api/node_certs.py)."""
    service = nd.DESCRIPTOR.services_by_name["NodeService"]
    rpcs: list[Rpc] = []
    for method in service.methods:
        request = getattr(nd, method.input_type.name)
        response = getattr(nd, method.output_type.name)
        if method.name == "IssueNodeCertificate":
            # Authorized by the join proof in the request: no bearer token crosses this port.
            rpcs.append(Unary(method.name, request, response, certificates.bootstrap, credential=True))
        elif method.server_streaming:
            rpcs.append(ServerStream(method.name, request, response, node_port_only_stream))
        else:
            rpcs.append(Unary(method.name, request, response, node_port_only))
    return Service(service, tuple(rpcs))


def node_admin_service(admin: NodeAdminApi) -> Service:
    return Service(
        nadm.DESCRIPTOR.services_by_name["NodeAdminService"],
        (
            Unary("ListNodes", nadm.ListNodesRequest, nadm.ListNodesResponse, admin.list_nodes),
            Unary("CordonNode", nadm.CordonNodeRequest, nadm.CordonNodeResponse, admin.cordon_node),
            Unary("UncordonNode", nadm.UncordonNodeRequest, nadm.UncordonNodeResponse, admin.uncordon_node),
            Unary("DrainNode", nadm.DrainNodeRequest, nadm.DrainNodeResponse, admin.drain_node),
            Unary("ForgetNode", nadm.ForgetNodeRequest, nadm.ForgetNodeResponse, admin.forget_node),
        ),
    )


def node_storage_service(storage: NodeStorageApi) -> Service:
    # Served with NodeGuestService (node_host.py): a node's side of moving disks.
    return Service(
        nst.DESCRIPTOR.services_by_name["NodeStorageService"],
        (
            Unary("ListStorage", nst.ListStorageRequest, nst.ListStorageResponse, storage.list_storage),
            ServerStream("ReadStorage", nst.ReadStorageRequest, nst.ReadStorageResponse, storage.read_storage),
            Unary(
                "GetStorageReceived",
                nst.GetStorageReceivedRequest,
                nst.GetStorageReceivedResponse,
                storage.get_storage_received,
            ),
            Unary("WriteStorage", nst.WriteStorageRequest, nst.WriteStorageResponse, storage.write_storage),
            Unary("FinishStorage", nst.FinishStorageRequest, nst.FinishStorageResponse, storage.finish_storage),
            Unary("DropStorage", nst.DropStorageRequest, nst.DropStorageResponse, storage.drop_storage),
        ),
    )


def node_guest_service(guests: NodeGuestApi) -> Service:
    # Served by a node agent (node_host.py) to the control plane: the data plane's last hop.
    return Service(
        ngu.DESCRIPTOR.services_by_name["NodeGuestService"],
        (
            ServerStream("RunGuestJob", ngu.RunGuestJobRequest, ngu.RunGuestJobResponse, guests.run_guest_job),
            BidiStream("OpenGuestPort", ngu.OpenGuestPortRequest, ngu.OpenGuestPortResponse, guests.open_guest_port),
            Unary(
                "CallGuestProcesses",
                ngu.CallGuestProcessesRequest,
                ngu.CallGuestProcessesResponse,
                guests.call_guest_processes,
            ),
            ServerStream(
                "FollowGuestProcess",
                ngu.FollowGuestProcessRequest,
                ngu.FollowGuestProcessResponse,
                guests.follow_guest_process,
            ),
        ),
    )
