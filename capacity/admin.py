from django.contrib import admin

from capacity.models import GpuPool, GpuType, ModelProfile, Reservation

admin.site.register([GpuType, GpuPool, ModelProfile, Reservation])
