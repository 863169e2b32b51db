"""The API without a transport: protobuf requests in, protobuf responses out.

parse.py turns wire requests into domain requests, render.py records into wire messages;
control_plane.py serves WorkspaceService, VolumeService and ObservationService,
data_plane.py DataPlaneService. The transports (transport/) only decode, authenticate,
call these and map errors."""
