from django.contrib import admin

from controlplane.capacity.models import GpuPool, GpuType, ModelProfile, Reservation

admin.site.register([GpuType, GpuPool, ModelProfile, Reservation])
