package verbs

// Accessors for transports with device-specific extensions (ibverbs:
// dmabuf registration for GPU memory, rdma_cm connection of existing queue
// pairs). They return nil for objects that verbs implements itself.

// Native returns the device protection domain behind pd, or nil.
func (pd *PD) Native() NativePD { return pd.native }

// Native returns the device queue pair behind qp, or nil.
func (qp *QP) Native() NativeQP { return qp.native }

// Native returns the device completion queue behind cq, or nil.
func (cq *CQ) Native() NativeCQ { return cq.native }
