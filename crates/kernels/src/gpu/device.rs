//! The device through wgpu: adapter, buffers, the products kernel and the
//! gated FFN around it (see the module docs of [`crate::gpu`]).

use std::sync::mpsc;

use wgpu::util::DeviceExt;

use crate::accel::products::{self, Params, ProductsDevice, ProductsMatrix, Uploadable, column_acts, dispatch};
use crate::act::{ActivationPrecision, Layout};
use crate::error::{Error, Result};
use crate::matrix::Matrix;
use crate::threads::GatedAct;

/// The products kernel (`products`).
const SHADER: &str = include_str!("products.wgsl");

// The shader's `@workgroup_size(16, 4)` and `ROWS` are written out in it.
const _: () = assert!(products::LANES_PER_ROW == 16 && products::ROWS_PER_GROUP == 4);

/// What a GPU holds of a run: the device, its queue and the products
/// pipeline. Products are submitted and waited for one call at a time.
pub struct Device {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipeline: wgpu::ComputePipeline,
    bind_layout: wgpu::BindGroupLayout,
    /// The adapter's name and backend, as a start-up line shows it.
    name: String,
    /// The largest storage buffer one binding may see.
    binding_bytes_max: u64,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("name", &self.name).finish_non_exhaustive()
    }
}

/// A q8 or q4 matrix on the device, its bytes the container's own.
#[derive(Debug)]
pub struct DeviceMatrix {
    rows: usize,
    cols: usize,
    /// The kernel's parameters, checked at upload.
    params: Params,
    layout: Layout,
    /// The weight bytes, rows back to back, padded to whole words.
    qs: wgpu::Buffer,
    scales: wgpu::Buffer,
}

/// Quantized activation vectors on the device, for one layout.
struct DeviceActs {
    layout: Layout,
    n: usize,
    codes: wgpu::Buffer,
    lane_scales: wgpu::Buffer,
}

impl Device {
    /// The first GPU with compute shaders (a hardware one before a software
    /// one such as Mesa's lavapipe), or why there is none.
    pub fn new() -> Result<Self> {
        let backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = pollster::block_on(instance.enumerate_adapters(backends));
        let adapter = adapters
            .into_iter()
            .filter(|a| a.get_downlevel_capabilities().flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS))
            .min_by_key(|a| a.get_info().device_type == wgpu::DeviceType::Cpu)
            .ok_or_else(|| Error::NoGpuAdapter {
                reason: "no Vulkan, Metal or DX12 adapter with compute shaders (a software one: Mesa's lavapipe, \
                         Debian's mesa-vulkan-drivers)"
                    .into(),
            })?;
        let info = adapter.get_info();
        let name = format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type);
        // The adapter's own limits: the defaults' 128 MiB binding would keep
        // a model's larger matrices off the device.
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("strata"),
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| Error::Gpu { reason: format!("{name}: {e}") })?;
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("products"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let uniform = wgpu::BindGroupLayoutEntry {
            binding: 5,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let bind_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("products"),
            entries: &[
                storage(0, true),
                storage(1, true),
                storage(2, true),
                storage(3, true),
                storage(4, false),
                uniform,
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("products"),
            bind_group_layouts: &[Some(&bind_layout)],
            ..Default::default()
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("products"),
            layout: Some(&pipeline_layout),
            module: &module,
            entry_point: Some("products"),
            compilation_options: Default::default(),
            cache: None,
        });
        let binding_bytes_max = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        Ok(Self { device, queue, pipeline, bind_layout, name, binding_bytes_max })
    }

    /// The adapter: its name, backend and kind.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Uploads a q8 or q4 matrix whose group the integer path takes, as it
    /// is stored; anything else stays on the host ([`Error::GpuUnsupported`]).
    pub fn upload(&self, m: &Matrix<'_>) -> Result<DeviceMatrix> {
        let Uploadable { layout, params, qs, scales } = Uploadable::of(m)?;
        let qs = self.storage_init("weights", &padded_words(qs))?;
        let scales = self.storage_init("scales", bytemuck::cast_slice(scales))?;
        Ok(DeviceMatrix { rows: m.rows, cols: m.cols, layout, params, qs, scales })
    }

    /// `ys[t] = W xs[t]` for the `n` inputs `xs` (`[n, cols]`), their
    /// codes quantized at `precision`: bit for bit the CPU's integer path.
    ///
    /// # Panics
    /// If `xs` is not `[n, cols]` or `ys` not `[n, rows]`, or the device
    /// fails (it is lost, or out of memory).
    pub fn matmul(&self, m: &DeviceMatrix, precision: ActivationPrecision, xs: &[f32], n: usize, ys: &mut [f32]) {
        products::matmul(self, m, precision, xs, n, ys)
    }

    /// The gated feed-forward block of one expert (or a dense MLP) on
    /// `[gate, up, down]` ([`products::gated_ffn`]): bit for bit
    /// [`crate::Threads::gated_ffn`] where the CPU takes the integer path.
    ///
    /// # Panics
    /// As [`crate::Threads::gated_ffn`], and if the device fails.
    pub fn gated_ffn(
        &self,
        matrices: [&DeviceMatrix; 3],
        act: GatedAct<'_>,
        precision: ActivationPrecision,
        xs: &[f32],
        n: usize,
        ys: &mut [f32],
    ) {
        products::gated_ffn(self, matrices, act, precision, xs, n, ys)
    }

    /// `xs` (`[n, cols]`) quantized for `layout` by the CPU's quantizer, on
    /// the device in column order.
    fn upload_acts(
        &self,
        layout: Layout,
        precision: ActivationPrecision,
        xs: &[f32],
        n: usize,
        cols: usize,
    ) -> DeviceActs {
        let (codes, lane_scales) = column_acts(layout, precision, xs, n, cols);
        let expect = "activations within a binding: [n, cols] was checked against the device's limits";
        let codes = self.storage_init("codes", bytemuck::cast_slice(&codes)).expect(expect);
        let lane_scales = self.storage_init("lane scales", bytemuck::cast_slice(&lane_scales)).expect(expect);
        DeviceActs { layout, n, codes, lane_scales }
    }

    /// Records the products of `m` with `acts` into a new output buffer.
    fn encode_products(&self, encoder: &mut wgpu::CommandEncoder, m: &DeviceMatrix, acts: &DeviceActs) -> wgpu::Buffer {
        assert_eq!(m.layout, acts.layout, "activations quantized for another layout");
        let params = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: bytemuck::bytes_of(&m.params),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let out_bytes = (acts.n * m.rows * size_of::<f32>()).max(size_of::<f32>()) as u64;
        let out = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("products"),
            size: out_bytes,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let buffers = [&m.qs, &m.scales, &acts.codes, &acts.lane_scales, &out, &params];
        let entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .enumerate()
            .map(|(binding, buffer)| wgpu::BindGroupEntry {
                binding: binding as u32,
                resource: buffer.as_entire_binding(),
            })
            .collect();
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("products"),
            layout: &self.bind_layout,
            entries: &entries,
        });
        if let Some([x, y, z]) = dispatch(m.rows, acts.n) {
            let mut pass = encoder.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(x, y, z);
        }
        out
    }

    /// Submits `encoder` with copies of each output buffer, waits, and
    /// reads each into its destination.
    fn read_back(&self, mut encoder: wgpu::CommandEncoder, outputs: &mut [(&wgpu::Buffer, &mut [f32])]) {
        let total_bytes: usize = outputs.iter().map(|(_, dst)| size_of_val(*dst)).sum();
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("read back"),
            size: total_bytes.max(size_of::<f32>()) as u64,
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
            mapped_at_creation: false,
        });
        let mut offset = 0u64;
        for (buffer, dst) in outputs.iter() {
            let bytes = size_of_val(*dst) as u64;
            if bytes > 0 {
                encoder.copy_buffer_to_buffer(buffer, 0, &staging, offset, bytes);
            }
            offset += bytes;
        }
        self.queue.submit([encoder.finish()]);
        let slice = staging.slice(..);
        let (sender, receiver) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |mapped| {
            // The receiver waits below; it cannot be gone.
            let _ = sender.send(mapped);
        });
        self.device.poll(wgpu::PollType::wait_indefinitely()).expect("the device finishes its work");
        receiver.recv().expect("the map callback ran").expect("the read-back buffer maps");
        {
            let mapped = slice.get_mapped_range().expect("mapped for reading above");
            let values: &[f32] = bytemuck::cast_slice(&mapped[..]);
            let mut at = 0;
            for (_, dst) in outputs.iter_mut() {
                dst.copy_from_slice(&values[at..at + dst.len()]);
                at += dst.len();
            }
        }
        staging.unmap();
    }

    /// A read-only storage buffer holding `contents` (at least one word), if
    /// one binding may see it.
    fn storage_init(&self, what: &'static str, contents: &[u8]) -> Result<wgpu::Buffer> {
        let bytes = contents.len() as u64;
        if bytes > self.binding_bytes_max {
            return Err(Error::Gpu {
                reason: format!("{what}: {bytes} bytes, more than one binding of {} may hold", self.name),
            });
        }
        let word = [0u8; size_of::<u32>()];
        // wgpu gives no size of free VRAM (`--vram-budget auto` sets no cap):
        // a refused allocation is caught here, so that the matrix stays on
        // the host rather than the device being lost.
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(what),
            contents: if contents.is_empty() { &word } else { contents },
            usage: wgpu::BufferUsages::STORAGE,
        });
        match pollster::block_on(scope.pop()) {
            None => Ok(buffer),
            Some(_) => Err(Error::GpuOutOfMemory { what, bytes }),
        }
    }
}

impl DeviceMatrix {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes this matrix holds on the device.
    pub fn bytes(&self) -> u64 {
        self.qs.size() + self.scales.size()
    }
}

/// `bytes` padded with zeros to whole 32-bit words.
fn padded_words(bytes: &[u8]) -> Vec<u8> {
    let mut words = bytes.to_vec();
    words.resize(bytes.len().next_multiple_of(size_of::<u32>()), 0);
    words
}

impl ProductsMatrix for DeviceMatrix {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }
}

impl ProductsDevice for Device {
    type Matrix = DeviceMatrix;

    fn products(
        &self,
        matrices: &[&DeviceMatrix],
        precision: ActivationPrecision,
        xs: &[f32],
        n: usize,
        outs: &mut [&mut [f32]],
    ) {
        assert_eq!(matrices.len(), outs.len(), "one output per matrix");
        let mut acts: Vec<DeviceActs> = Vec::new();
        let mut encoder = self.device.create_command_encoder(&Default::default());
        let mut buffers = Vec::with_capacity(matrices.len());
        for m in matrices {
            // Quantized once per layout: gate and up share theirs.
            let at = match acts.iter().position(|a| a.layout == m.layout) {
                Some(at) => at,
                None => {
                    acts.push(self.upload_acts(m.layout, precision, xs, n, m.cols));
                    acts.len() - 1
                }
            };
            buffers.push(self.encode_products(&mut encoder, m, &acts[at]));
        }
        let mut outputs: Vec<(&wgpu::Buffer, &mut [f32])> =
            buffers.iter().zip(outs.iter_mut()).map(|(buffer, out)| (buffer, &mut **out)).collect();
        self.read_back(encoder, &mut outputs);
    }
}
