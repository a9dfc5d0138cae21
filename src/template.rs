//! NodeGroupTemplateNodeInfo: the Kubernetes Node a new worker of a group would be.
